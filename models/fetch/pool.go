package fetch

import (
	"context"
	"fmt"
)

// BufferPool hands out chunk buffers. Every byte Fetch holds in memory is in
// one of them, so a pool shared by all of a node's fetches bounds the node's
// memory for streaming, whatever the number or size of files.
type BufferPool interface {
	// Get blocks until a buffer is free or ctx is done.
	Get(ctx context.Context) ([]byte, error)
	Put(b []byte)
}

// Pool is a BufferPool of at most n buffers of size bytes each, allocated on
// first use.
type Pool struct {
	free chan []byte
	// tokens holds one entry per buffer not yet allocated.
	tokens chan struct{}
	size   int
}

var _ BufferPool = (*Pool)(nil)

// NewPool returns a pool of n buffers of size bytes.
func NewPool(n, size int) *Pool {
	p := &Pool{free: make(chan []byte, n), tokens: make(chan struct{}, n), size: size}
	for range n {
		p.tokens <- struct{}{}
	}
	return p
}

// Get returns a free buffer, allocating one while fewer than n exist.
func (p *Pool) Get(ctx context.Context) ([]byte, error) {
	select {
	case b := <-p.free:
		return b, nil
	default:
	}
	select {
	case b := <-p.free:
		return b, nil
	case <-p.tokens:
		return make([]byte, p.size), nil
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for a buffer: %w", ctx.Err())
	}
}

// Put returns b to the pool.
func (p *Pool) Put(b []byte) {
	p.free <- b[:cap(b)]
}
