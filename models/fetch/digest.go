package fetch

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
)

// prefixHasher takes the file's SHA-256 while the fetch runs: chunks
// complete out of order, and each run of them is read back (from the page
// cache, just written) and hashed as soon as every chunk before it is done.
// The digest then costs no second pass over the file at the end, and the
// hashing overlaps the reads of later chunks.
type prefixHasher struct {
	f     *fetcher
	h     hash.Hash
	next  int    // the first chunk not hashed yet
	ready []bool // complete chunks, hashed or not
	buf   []byte

	in     chan int
	result chan hashResult
}

type hashResult struct {
	sum string
	err error
}

// hashReadSize is what the hasher reads back at a time.
const hashReadSize = 1 << 20

// newPrefixHasher starts hashing f's file; the chunks f.done already marks
// (resumed from the journal) count as complete.
func newPrefixHasher(f *fetcher) *prefixHasher {
	p := &prefixHasher{f: f, h: sha256.New(), ready: make([]bool, f.chunks), buf: make([]byte, hashReadSize),
		in: make(chan int, f.chunks), result: make(chan hashResult, 1)}
	copy(p.ready, f.done)
	go p.run()
	return p
}

// completed tells the hasher that chunk i is written.
func (p *prefixHasher) completed(i int) { p.in <- i }

// sum waits for the digest of the whole file. all says every chunk was
// written: otherwise the fetch failed and the digest is not wanted.
func (p *prefixHasher) sum(all bool) (string, error) {
	close(p.in)
	r := <-p.result
	if !all {
		return "", nil
	}
	if r.err == nil && p.next != p.f.chunks {
		return "", fmt.Errorf("hash %s: %d of %d chunks hashed", p.f.partial, p.next, p.f.chunks)
	}
	return r.sum, r.err
}

func (p *prefixHasher) run() {
	var err error
	advance := func() {
		for err == nil && p.next < p.f.chunks && p.ready[p.next] {
			err = p.hashChunk(p.next)
			p.next++
		}
	}
	advance()
	for i := range p.in {
		p.ready[i] = true
		advance()
	}
	p.result <- hashResult{sum: hex.EncodeToString(p.h.Sum(nil)), err: err}
}

func (p *prefixHasher) hashChunk(i int) error {
	off, n := p.f.chunkRange(i)
	for n > 0 {
		b := p.buf[:min(int64(len(p.buf)), n)]
		if _, err := p.f.file.ReadAt(b, off); err != nil {
			return fmt.Errorf("hash %s at %d: %w", p.f.partial, off, err)
		}
		p.h.Write(b)
		off += int64(len(b))
		n -= int64(len(b))
	}
	return nil
}
