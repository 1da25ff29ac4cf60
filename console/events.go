package console

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// EventCache reads the events of a namespace for why and the workload
// pages, and keeps them for a few seconds: the console has no informer on
// events, which churn far more than anything it shows. Reads are made by
// the reader given (the user's own client in local mode, the console's in
// shared mode), and shown only to callers who may list pods and events
// there.
type EventCache struct {
	reader client.Reader
	ttl    time.Duration
	cache  *cache.LRUExpireCache
}

// NewEventCache caches reader's event lists for ttl, for at most size
// namespaces.
func NewEventCache(reader client.Reader, ttl time.Duration, size int, c clock.Clock) *EventCache {
	return &EventCache{reader: reader, ttl: ttl, cache: cache.NewLRUExpireCacheWithClock(size, c)}
}

// Events returns the events of namespace; fresh skips the cache.
func (e *EventCache) Events(ctx context.Context, namespace string, fresh bool) ([]corev1.Event, error) {
	if !fresh {
		if v, ok := e.cache.Get(namespace); ok {
			return v.([]corev1.Event), nil
		}
	}
	var l corev1.EventList
	if err := e.reader.List(ctx, &l, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("list events in %s: %w", namespace, err)
	}
	for i := range l.Items {
		l.Items[i].ManagedFields = nil
	}
	e.cache.Add(namespace, l.Items, e.ttl)
	return l.Items, nil
}
