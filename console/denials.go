package console

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// denialsMetric is the webhook's counter of refusals by reason.
const denialsMetric = "partita_webhook_denials_total"

// WebhookScraper counts the webhook's denials without Prometheus: it finds
// the webhook from its MutatingWebhookConfiguration (a URL on the dev
// cluster, a Service in a chart install, whose every ready endpoint it
// scrapes) and reads partita_webhook_denials_total from each replica's
// /metrics, over TLS checked with the configuration's CA bundle. The
// counts are since each replica started. Answers are kept for a while.
type WebhookScraper struct {
	reader client.Reader
	// configuration is the MutatingWebhookConfiguration's name.
	configuration string
	ttl           time.Duration
	clock         clock.PassiveClock

	lock    sync.Mutex
	at      time.Time
	counts  []DenialCount
	lastErr error
}

// NewWebhookScraper finds the webhook through reader.
func NewWebhookScraper(reader client.Reader, configuration string, ttl time.Duration, c clock.PassiveClock) *WebhookScraper {
	return &WebhookScraper{reader: reader, configuration: configuration, ttl: ttl, clock: c}
}

// Denials returns the counts by reason, summed over the replicas.
func (w *WebhookScraper) Denials(ctx context.Context) ([]DenialCount, error) {
	w.lock.Lock()
	defer w.lock.Unlock()
	if !w.at.IsZero() && w.clock.Since(w.at) < w.ttl {
		return w.counts, w.lastErr
	}
	w.counts, w.lastErr = w.scrape(ctx)
	w.at = w.clock.Now()
	return w.counts, w.lastErr
}

// target is one replica's metrics endpoint.
type target struct {
	url        string
	serverName string
}

func (w *WebhookScraper) scrape(ctx context.Context) ([]DenialCount, error) {
	var mwc admissionregistrationv1.MutatingWebhookConfiguration
	if err := w.reader.Get(ctx, client.ObjectKey{Name: w.configuration}, &mwc); err != nil {
		return nil, fmt.Errorf("find the webhook (MutatingWebhookConfiguration %s): %w", w.configuration, err)
	}
	if len(mwc.Webhooks) == 0 {
		return nil, fmt.Errorf("MutatingWebhookConfiguration %s has no webhooks", w.configuration)
	}
	cc := mwc.Webhooks[0].ClientConfig
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(cc.CABundle) {
		return nil, fmt.Errorf("MutatingWebhookConfiguration %s has no CA bundle to check the webhook with", w.configuration)
	}
	targets, err := w.targets(ctx, cc)
	if err != nil {
		return nil, err
	}
	if len(targets) == 0 {
		return nil, errors.New("the webhook has no ready endpoint")
	}
	// The replicas at once: one that does not answer costs its timeout
	// once, not once per replica.
	results := make([]map[string]float64, len(targets))
	scrapeErrs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Go(func() { results[i], scrapeErrs[i] = scrapeOne(ctx, t, pool) })
	}
	wg.Wait()
	sum := map[string]float64{}
	var errs []error
	for i := range targets {
		if scrapeErrs[i] != nil {
			errs = append(errs, scrapeErrs[i])
			continue
		}
		for r, n := range results[i] {
			sum[r] += n
		}
	}
	if len(errs) == len(targets) {
		return nil, fmt.Errorf("read the webhook's metrics: %w", errors.Join(errs...))
	}
	out := make([]DenialCount, 0, len(sum))
	for r, n := range sum {
		out = append(out, DenialCount{Reason: r, Count: n})
	}
	slices.SortFunc(out, func(a, b DenialCount) int { return strings.Compare(a.Reason, b.Reason) })
	return out, errors.Join(errs...)
}

// targets are the replicas behind a webhook client config.
func (w *WebhookScraper) targets(ctx context.Context, cc admissionregistrationv1.WebhookClientConfig) ([]target, error) {
	if cc.URL != nil {
		u, err := url.Parse(*cc.URL)
		if err != nil {
			return nil, fmt.Errorf("webhook URL %q: %w", *cc.URL, err)
		}
		return []target{{url: u.Scheme + "://" + u.Host + "/metrics", serverName: u.Hostname()}}, nil
	}
	if cc.Service == nil {
		return nil, errors.New("the webhook configuration names neither a URL nor a Service")
	}
	ref := cc.Service
	var svc corev1.Service
	if err := w.reader.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, &svc); err != nil {
		return nil, fmt.Errorf("read the webhook's Service %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	port := int32(443)
	if ref.Port != nil {
		port = *ref.Port
	}
	portName := ""
	for _, p := range svc.Spec.Ports {
		if p.Port == port {
			portName = p.Name
		}
	}
	var slices discoveryv1.EndpointSliceList
	if err := w.reader.List(ctx, &slices, client.InNamespace(ref.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: ref.Name}); err != nil {
		return nil, fmt.Errorf("list the webhook's endpoints: %w", err)
	}
	serverName := ref.Name + "." + ref.Namespace + ".svc"
	var out []target
	for _, es := range slices.Items {
		var target int32
		for _, p := range es.Ports {
			if p.Port != nil && (p.Name == nil && portName == "" || p.Name != nil && *p.Name == portName) {
				target = *p.Port
			}
		}
		if target == 0 {
			continue
		}
		for _, ep := range es.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, a := range ep.Addresses {
				out = append(out, newTarget(a, target, serverName))
			}
		}
	}
	return out, nil
}

func newTarget(addr string, port int32, serverName string) target {
	return target{url: "https://" + net.JoinHostPort(addr, strconv.Itoa(int(port))) + "/metrics", serverName: serverName}
}

// scrapeOne reads one replica's denial counts by reason.
func scrapeOne(ctx context.Context, t target, pool *x509.CertPool) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: t.serverName, MinVersion: tls.VersionTLS12}}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", t.url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", t.url, resp.Status)
	}
	return parseDenials(io.LimitReader(resp.Body, 16<<20))
}

// parseDenials sums partita_webhook_denials_total by reason from a
// Prometheus text exposition.
func parseDenials(r io.Reader) (map[string]float64, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	out := map[string]float64{}
	f, ok := families[denialsMetric]
	if !ok {
		return out, nil
	}
	for _, m := range f.GetMetric() {
		out[label(m, "reason")] += m.GetCounter().GetValue()
	}
	return out, nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
