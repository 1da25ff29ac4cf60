package console

import (
	"sync"
)

// Hub tells the open pages that a new snapshot exists. It carries no data:
// each page's stream (stream.go) compares the new snapshot with the last
// one it sent and writes what changed, filtered for its viewer. A slow
// page therefore skips snapshots instead of queueing them, and the builder
// never waits for a page.
type Hub struct {
	lock sync.Mutex
	subs map[chan struct{}]struct{}
}

// NewHub returns a Hub with no subscribers.
func NewHub() *Hub { return &Hub{subs: map[chan struct{}]struct{}{}} }

// Subscribe returns a channel that receives a value after each new
// snapshot (several snapshots may give one value), and the function that
// ends the subscription.
func (h *Hub) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	h.lock.Lock()
	h.subs[ch] = struct{}{}
	h.lock.Unlock()
	return ch, func() {
		h.lock.Lock()
		delete(h.subs, ch)
		h.lock.Unlock()
	}
}

// Publish wakes every subscriber.
func (h *Hub) Publish() {
	h.lock.Lock()
	defer h.lock.Unlock()
	for ch := range h.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Subscribers counts the open streams.
func (h *Hub) Subscribers() int {
	h.lock.Lock()
	defer h.lock.Unlock()
	return len(h.subs)
}
