package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/console"
	pt "github.com/partita-dev/partita/internal/partitatest"
	"github.com/partita-dev/partita/report"
)

// TestConsoleMapByTopology (issue 28: people see the topology their gangs
// are placed in): a Topology of blocks and racks over four simulated nodes
// labelled for it. In a real browser, the console's map, once the user
// picks the Topology, nests the nodes block → rack → node: rack r1 of
// block b1 apart from rack r1 of block b2, a node without a rack under
// "(no rack)", the dev cluster's own nodes under "(no block)"; each domain
// headed by its free and total GPUs, which follow a pod placed after the
// page loaded. kubectl partita nodes --topology gives the same tree with
// the same numbers.
func TestConsoleMapByTopology(t *testing.T) {
	ctx := testContext(t, 8*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	const block, rack = "e2e.partita.dev/block", "e2e.partita.dev/rack"
	type place struct{ node, block, rack string }
	places := []place{
		{ns + "-b1-r1", "b1", "r1"},
		{ns + "-b1-r2", "b1", "r2"},
		{ns + "-b2-r1", "b2", "r1"},
		{ns + "-b2", "b2", ""},
	}
	for _, p := range places {
		// dev up removes simulated nodes it did not make unless type=e2e.
		labels := map[string]string{block: p.block, "type": "e2e"}
		if p.rack != "" {
			labels[rack] = p.rack
		}
		addGPUNode(ctx, t, p.node, 2, labels)
	}
	topology := "e2e-racks-" + ns
	c := crClient(t)
	topo := pt.MakeTopology(topology, block, rack).Obj()
	if err := c.Create(ctx, topo); err != nil {
		t.Fatalf("create Topology %s: %v", topology, err)
	}
	t.Cleanup(func() { _ = c.Delete(context.WithoutCancel(ctx), topo) })

	url := runConsole(t, "--kubeconfig", cluster.KubeconfigPath())
	b := startBrowser(t)
	dir := screenshotDir(t)
	// domain is the CSS selector of a domain section: a level's label and
	// value, or its "(no label)" domain when value is "".
	domain := func(level, value string) string {
		if value == "" {
			return fmt.Sprintf(`section.domain[data-level=%q][data-missing="true"]`, level)
		}
		return fmt.Sprintf(`section.domain[data-level=%q][data-value=%q]`, level, value)
	}
	head := func(sel string) string {
		return fmt.Sprintf(`(document.querySelector(%s) || {}).textContent`, jsString(sel+" > .domain-head .domain-gpus"))
	}

	t.Run("picking the Topology nests the nodes by its levels", func(t *testing.T) {
		page(t, b, time.Minute, "open the map", chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(".node")))
		opt := fmt.Sprintf(`#map-grouping option[value=%q]`, "topology:"+topology)
		waitFor(t, b, 30*time.Second, "the Topology among the map's groupings", fmt.Sprintf(`document.querySelector(%s) !== null`, jsString(opt)))
		page(t, b, 30*time.Second, "group by the Topology", chromedp.SetValue(chromedp.ID("map-grouping"), "topology:"+topology))
		for _, p := range places {
			sel := domain(block, p.block) + " > " + domain(rack, p.rack) + fmt.Sprintf(` .node[data-node=%q]`, p.node)
			waitFor(t, b, 30*time.Second, fmt.Sprintf("%s under block %s, rack %q", p.node, p.block, p.rack), fmt.Sprintf(`document.querySelector(%s) !== null`, jsString(sel)))
			if n := eval[int](t, b, fmt.Sprintf(`document.querySelectorAll(%s).length`, jsString(fmt.Sprintf(`.node[data-node=%q]`, p.node)))); n != 1 {
				t.Errorf("%s shows %d times on the map, want once", p.node, n)
			}
		}
		// The dev cluster's own nodes have no block: shown, not hidden.
		if n := eval[int](t, b, fmt.Sprintf(`document.querySelectorAll(%s).length`, jsString(domain(block, "")+" .node"))); n < e2eNodes {
			t.Errorf("%d nodes under (no %s), want at least the dev cluster's %d", n, block, e2eNodes)
		}
		for sel, want := range map[string]string{
			domain(block, "b1"):                            "2 nodes · 4 / 4 GPUs free",
			domain(block, "b2") + " > " + domain(rack, ""): "1 node · 2 / 2 GPUs free",
		} {
			if got := eval[string](t, b, head(sel)); got != want {
				t.Errorf("%s is headed %q, want %q", sel, got, want)
			}
		}
		shot(t, b, dir, "map-topology")
	})

	t.Run("a pod placed later changes its domains' free GPUs without a reload", func(t *testing.T) {
		eval[bool](t, b, `window.__noReload = true`)
		half := extGPUPod(ns, "half", 500, 1, map[string]string{corev1.LabelHostname: places[0].node})
		createPods(ctx, t, clientset, []*corev1.Pod{half}, 1)
		waitFor(t, b, time.Minute, "half on the map", fmt.Sprintf(`document.querySelector(%s) !== null`, jsString(fmt.Sprintf(`.slice[data-pod=%q]`, ns+"/half"))))
		r1 := domain(block, "b1") + " > " + domain(rack, "r1")
		waitFor(t, b, 30*time.Second, "block b1's free GPUs after half", fmt.Sprintf(`%s === "2 nodes · 3.5 / 4 GPUs free"`, head(domain(block, "b1"))))
		if got, want := eval[string](t, b, head(r1)), "1 node · 1.5 / 2 GPUs free"; got != want {
			t.Errorf("rack r1 of b1 is headed %q, want %q", got, want)
		}
		if got, want := eval[string](t, b, head(domain(block, "b2")+" > "+domain(rack, "r1"))), "1 node · 2 / 2 GPUs free"; got != want {
			t.Errorf("rack r1 of b2 is headed %q, want %q: it is not b1's rack r1", got, want)
		}
		if !eval[bool](t, b, `window.__noReload === true`) {
			t.Errorf("the page reloaded")
		}
		shot(t, b, dir, "map-topology-pod")
	})

	t.Run("kubectl partita nodes --topology gives the map's tree", func(t *testing.T) {
		out, err := partita(ctx, "ctl", "nodes", "--topology", topology, "-o", "json", "--kubeconfig", cluster.KubeconfigPath())
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		var rep report.NodesReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Topology == nil {
			t.Fatalf("decode nodes --topology (%v):\n%s", err, out)
		}
		// The API the page reads, with the page's token.
		body := eval[string](t, b, fmt.Sprintf(`(async () => {
			const r = await fetch("/api/v1/map?topology=" + encodeURIComponent(%s), {headers: {Authorization: "Bearer " + localStorage.getItem("partita-console-token")}});
			return await r.text();
		})()`, jsString(topology)), chromedp.EvalAwaitPromise)
		var m console.MapView
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			t.Fatalf("decode the map: %v\n%s", err, body)
		}
		type line struct {
			Domain string
			Nodes  []string
			GPUs   int
			Free   int64
		}
		var fromCtl, fromMap []line
		var walkCtl func(ds []report.TopologyDomain, path string)
		walkCtl = func(ds []report.TopologyDomain, path string) {
			for _, d := range ds {
				p := path + "/" + report.DomainName(d.Level, d.Value, d.Missing)
				fromCtl = append(fromCtl, line{p, d.Nodes, d.GPUs, d.FreeMilli})
				walkCtl(d.Domains, p)
			}
		}
		var walkMap func(ds []console.MapDomain, path string)
		walkMap = func(ds []console.MapDomain, path string) {
			for _, d := range ds {
				p := path + "/" + report.DomainName(d.Level, d.Value, d.Missing)
				fromMap = append(fromMap, line{p, d.Nodes, d.GPUs, d.FreeMilli})
				walkMap(d.Domains, p)
			}
		}
		walkCtl(rep.Topology.Domains, "")
		walkMap(m.Domains, "")
		if diff := cmp.Diff(fromCtl, fromMap); diff != "" {
			t.Errorf("the tree (-kubectl partita nodes --topology,+console):\n%s", diff)
		}
		if !strings.Contains(fmt.Sprint(fromCtl), "/"+block+"=b1/"+rack+"=r1 ["+places[0].node+"]") {
			t.Errorf("kubectl partita nodes --topology has no rack r1 of b1 holding %s: %v", places[0].node, fromCtl)
		}
	})

	t.Run("grouping by nothing takes the domains away", func(t *testing.T) {
		page(t, b, 30*time.Second, "group by nothing", chromedp.SetValue(chromedp.ID("map-grouping"), "none"))
		if n := eval[int](t, b, `document.querySelectorAll("section.domain.nested, .domain > h2").length`); n != 0 {
			t.Errorf("%d domains or headings left after grouping by nothing", n)
		}
		if n := eval[int](t, b, fmt.Sprintf(`document.querySelectorAll(%s).length`, jsString(fmt.Sprintf(`.node[data-node=%q]`, places[3].node)))); n != 1 {
			t.Errorf("%s shows %d times, want once", places[3].node, n)
		}
	})
}
