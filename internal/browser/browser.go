// Package browser starts the headless Chromium that the console's tests,
// its benchmark and its screenshots use, through chromedp, with the flags
// a machine without outside network needs. It owns nothing else and
// imports no Partita package.
package browser

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"

	"github.com/chromedp/chromedp"
)

// EnvChromium names a browser binary to use instead of chromium on PATH.
const EnvChromium = "PARTITA_CHROMIUM"

// Find returns the browser to run: $PARTITA_CHROMIUM, else chromium on
// PATH (Debian's package, which hack/install-chromium.sh installs).
func Find() (string, error) {
	if p := os.Getenv(EnvChromium); p != "" {
		return exec.LookPath(p)
	}
	p, err := exec.LookPath("chromium")
	if err != nil {
		return "", errors.New("no chromium on PATH: run hack/install-chromium.sh (make test does), or set " + EnvChromium + " to a Chromium or Chrome binary")
	}
	return p, nil
}

// Options shape the browser window.
type Options struct {
	Width, Height int
}

// Browser is one headless Chromium with a fresh profile.
type Browser struct {
	// Ctx is the first tab's chromedp context.
	Ctx    context.Context
	cancel []context.CancelFunc
	dir    string
}

// Start runs a headless Chromium until Close (or ctx ends).
func Start(ctx context.Context, o Options) (*Browser, error) {
	bin, err := Find()
	if err != nil {
		return nil, err
	}
	if o.Width == 0 {
		o.Width, o.Height = 1500, 1000
	}
	dir, err := os.MkdirTemp("", "partita-chromium-")
	if err != nil {
		return nil, fmt.Errorf("make the browser's profile directory: %w", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		// The machine has no outside network: nothing may try to reach it.
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(dir),
		chromedp.WindowSize(o.Width, o.Height),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	tctx, cancelTab := chromedp.NewContext(actx)
	b := &Browser{Ctx: tctx, cancel: []context.CancelFunc{cancelTab, cancelAlloc}, dir: dir}
	// Start it now, so a browser that cannot start fails here.
	if err := chromedp.Do(tctx, chromedp.Navigate("about:blank")); err != nil {
		b.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	return b, nil
}

// Close stops the browser and removes its profile.
func (b *Browser) Close() {
	for _, c := range b.cancel {
		c()
	}
	_ = os.RemoveAll(b.dir)
}

// Screenshot saves the whole page as a PNG.
func (b *Browser) Screenshot(ctx context.Context, path string) error {
	buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		return fmt.Errorf("screenshot: %w", err)
	}
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		return fmt.Errorf("save screenshot: %w", err)
	}
	return nil
}
