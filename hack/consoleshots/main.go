// Command consoleshots saves screenshots of a running Partita console's
// pages, for docs/guide/console.md: start the console (make demo prints
// its URL), then
//
//	go run ./hack/consoleshots -url 'http://127.0.0.1:PORT/#token=...' -out /tmp/shots
//
// and look at the PNGs before copying the good ones into docs/guide/images/.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/partita-dev/partita/internal/browser"
)

func main() {
	url := flag.String("url", "", "the console's URL, as partita console printed it (with its #token)")
	out := flag.String("out", "", "directory for the PNGs")
	width := flag.Int("width", 1400, "window width")
	flag.Parse()
	if *url == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: consoleshots -url URL -out DIR")
		os.Exit(2)
	}
	if err := run(*url, *out, *width); err != nil {
		fmt.Fprintln(os.Stderr, "consoleshots:", err)
		os.Exit(1)
	}
}

func run(url, out string, width int) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b, err := browser.Start(ctx, browser.Options{Width: width, Height: 900})
	if err != nil {
		return err
	}
	defer b.Close()
	base := strings.SplitN(url, "#", 2)[0]
	save := func(name, path, wait string) error {
		tctx, cancel := context.WithTimeout(b.Ctx, time.Minute)
		defer cancel()
		target := base + strings.TrimPrefix(path, "/")
		if name == "map" {
			target = url
		}
		if err := chromedp.Do(tctx, chromedp.Navigate(target), chromedp.WaitVisible(chromedp.CSS(wait)), chromedp.Sleep(time.Second)); err != nil {
			return fmt.Errorf("%s (%s): %w", name, path, err)
		}
		if name == "map" {
			// Keep the pods of a shared GPU in the side panel.
			if _, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`(() => {
				const g = [...document.querySelectorAll(".gpu")].find((el) => el.querySelectorAll(".slice").length > 1);
				if (g) g.dispatchEvent(new MouseEvent("click", {bubbles: true}));
				return !!g;
			})()`)); err != nil {
				return err
			}
		}
		p := filepath.Join(out, "console-"+name+".png")
		if err := b.Screenshot(tctx, p); err != nil {
			return err
		}
		fmt.Println(p)
		return nil
	}
	for _, pg := range []struct{ name, path, wait string }{
		{"map", "/", ".node"},
		{"queues", "/queues", "#queues"},
		{"workloads", "/workloads", "#workloads"},
		{"utilization", "/utilization?range=15m", "#chart-share"},
		{"policy", "/policy", "#policy-version"},
	} {
		if err := save(pg.name, pg.path, pg.wait); err != nil {
			return err
		}
	}
	// The first waiting workload, and its pod's why.
	tctx, cancel2 := context.WithTimeout(b.Ctx, time.Minute)
	defer cancel2()
	href, err := chromedp.Run(tctx, chromedp.Evaluate[string](`(async () => {
		const r = await fetch("/api/v1/workloads?phase=Waiting", {headers: {Authorization: "Bearer " + localStorage.getItem("partita-console-token")}});
		const w = (await r.json()).workloads[0];
		return w ? w.kind + "/" + w.namespace + "/" + w.name + " " + w.waitingPod : "";
	})()`, chromedp.EvalAwaitPromise))
	if err != nil || href == "" {
		return err
	}
	ref, pod, _ := strings.Cut(href, " ")
	ns := strings.Split(ref, "/")[1]
	if err := save("workload", "/workloads/"+ref, "#members"); err != nil {
		return err
	}
	return save("why", "/pods/"+ns+"/"+pod, "#why")
}
