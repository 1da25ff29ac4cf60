package fetch

import (
	"context"
	"fmt"
	"io"
	"net/http"
)

// HTTP reads http(s) URLs with Range requests. It insists on 206 and a
// Content-Range that matches what it asked, since a proxy that mangles ranges
// would otherwise write the wrong bytes at the right offset.
type HTTP struct {
	// Client defaults to http.DefaultClient.
	Client *http.Client
	// Header is added to every request (an Authorization header, say).
	Header http.Header
}

var _ Source = (*HTTP)(nil)
var _ Streamer = (*HTTP)(nil)

func (h *HTTP) client() *http.Client {
	if h.Client != nil {
		return h.Client
	}
	return http.DefaultClient
}

func (h *HTTP) request(ctx context.Context, method, url string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return nil, Permanent(fmt.Errorf("build request for %s: %w", url, err))
	}
	for k, vs := range h.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	return req, nil
}

// Stat sends a HEAD request; the tag is the ETag, or Last-Modified if the
// server sends no ETag.
func (h *HTTP) Stat(ctx context.Context, url string) (int64, string, error) {
	req, err := h.request(ctx, http.MethodHead, url)
	if err != nil {
		return 0, "", err
	}
	resp, err := h.client().Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("head %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return 0, "", fmt.Errorf("head %s: %w", url, statusError(resp))
	}
	if resp.ContentLength < 0 {
		return 0, "", Permanent(fmt.Errorf("head %s: server sent no Content-Length", url))
	}
	tag := resp.Header.Get("ETag")
	if tag == "" {
		tag = resp.Header.Get("Last-Modified")
	}
	return resp.ContentLength, tag, nil
}

// ReadRange sends a GET with Range: bytes=off-(off+len(p)-1).
func (h *HTTP) ReadRange(ctx context.Context, url string, off int64, p []byte) error {
	if len(p) == 0 {
		return nil
	}
	req, err := h.request(ctx, http.MethodGet, url)
	if err != nil {
		return err
	}
	last := off + int64(len(p)) - 1
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off, last))
	resp, err := h.client().Do(req)
	if err != nil {
		return fmt.Errorf("get %s range %d-%d: %w", url, off, last, err)
	}
	defer func() { _ = resp.Body.Close() }()
	switch resp.StatusCode {
	case http.StatusPartialContent:
		var a, b int64
		var total string
		cr := resp.Header.Get("Content-Range")
		if _, err := fmt.Sscanf(cr, "bytes %d-%d/%s", &a, &b, &total); err != nil || a != off || b != last {
			return Permanent(fmt.Errorf("get %s range %d-%d: server answered Content-Range %q", url, off, last, cr))
		}
	case http.StatusOK:
		// A whole-file answer is the right answer when the whole file was asked.
		if off != 0 || resp.ContentLength != int64(len(p)) {
			return fmt.Errorf("get %s range %d-%d: %w (status 200)", url, off, last, ErrRangeIgnored)
		}
	default:
		return fmt.Errorf("get %s range %d-%d: %w", url, off, last, statusError(resp))
	}
	if _, err := io.ReadFull(resp.Body, p); err != nil {
		return fmt.Errorf("get %s range %d-%d: read body: %w", url, off, last, err)
	}
	return nil
}

// Open sends a plain GET for the whole file.
func (h *HTTP) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	req, err := h.request(ctx, http.MethodGet, url)
	if err != nil {
		return nil, err
	}
	resp, err := h.client().Do(req)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		_ = resp.Body.Close()
		return nil, fmt.Errorf("get %s: %w", url, statusError(resp))
	}
	return resp.Body, nil
}

// statusError turns an unexpected status into an error, permanent unless a
// retry may help (server errors, timeouts, throttling).
func statusError(resp *http.Response) error {
	err := fmt.Errorf("unexpected status %s", resp.Status)
	switch {
	case resp.StatusCode >= 500, resp.StatusCode == http.StatusRequestTimeout, resp.StatusCode == http.StatusTooManyRequests:
		return err
	default:
		return Permanent(err)
	}
}
