package console_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/google/go-cmp/cmp"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/console"
	"github.com/partita-dev/partita/ctl"
	"github.com/partita-dev/partita/internal/envtestutil"
	pt "github.com/partita-dev/partita/internal/partitatest"
	"github.com/partita-dev/partita/report"
)

const h100MiB = 81559

// cluster is an API server with two teams' namespaces, a GPU node, a pod
// of each team on it, a waiting pod of team-a, and users:
//
//   - team-a/alice: works in team-a (pods, events), reads GPUNodes and
//     Queues, may not change queues;
//   - team-b/bob: reads GPUNodes and Queues and may change queues, may
//     list no pods anywhere;
//   - default/admin: cluster-admin.
type cluster struct {
	env   *envtest.Environment
	cfg   *rest.Config
	admin client.Client
	cs    kubernetes.Interface
}

func setup(t *testing.T) *cluster {
	t.Helper()
	env, cfg, admin := envtestutil.StartEnv(t)
	cs := kubernetes.NewForConfigOrDie(cfg)
	c := &cluster{env: env, cfg: cfg, admin: admin, cs: cs}
	ctx := t.Context()
	for _, ns := range []string{"team-a", "team-b", "partita-system"} {
		c.create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	for _, sa := range [][2]string{{"team-a", "alice"}, {"team-b", "bob"}, {"default", "admin"}} {
		c.create(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: sa[0], Name: sa[1]}})
	}
	subject := func(ns, name string) []rbacv1.Subject {
		return []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: name}}
	}
	c.create(t, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "gpu-viewer"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"partita.dev"}, Resources: []string{"gpunodes", "queues"}, Verbs: []string{"get", "list", "watch"}},
	}})
	c.create(t, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "queue-admin"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"partita.dev"}, Resources: []string{"queues"}, Verbs: []string{"create", "update", "patch"}},
	}})
	c.create(t, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "worker"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "create", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"list"}},
		{APIGroups: []string{"partita.dev"}, Resources: []string{"models"}, Verbs: []string{"get", "list", "watch"}},
	}})
	for _, b := range []struct {
		role, ns, name string
	}{{"gpu-viewer", "team-a", "alice"}, {"gpu-viewer", "team-b", "bob"}, {"queue-admin", "team-b", "bob"}, {"cluster-admin", "default", "admin"}} {
		c.create(t, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: b.role + "-" + b.name},
			RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: b.role}, Subjects: subject(b.ns, b.name)})
	}
	c.create(t, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "alice"},
		RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "worker"}, Subjects: subject("team-a", "alice")})

	gn := pt.MakeGPUNode("n1").Devices(4, "NVIDIA-H100-80GB-HBM3", h100MiB).Obj()
	st := gn.Status
	c.create(t, gn)
	gn.Status = st
	if err := admin.Status().Update(ctx, gn); err != nil {
		t.Fatal(err)
	}
	c.create(t, pt.MakeQueue("team-a").GPU("2", "3", 1).Namespaces("team-a").Obj())
	c.create(t, pt.MakeQueue("team-b").GPU("2", "-1", 1).Namespaces("team-b").Obj())
	c.bound(t, "team-a", "nb", "0.25", 0)
	c.bound(t, "team-b", "train", "1", 1)
	c.create(t, pt.MakePod("waiting", "team-a").GPUCount(8).Queue("team-a").SchedulingGates(v1alpha1.SchedulingGateAdmission).Obj())
	for _, ns := range []string{"team-a", "team-b"} {
		c.create(t, &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "llama"},
			Spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: "s3://models/" + ns + "/llama"}}})
	}
	return c
}

func (c *cluster) create(t *testing.T, o client.Object) {
	t.Helper()
	if err := c.admin.Create(t.Context(), o); err != nil {
		t.Fatalf("create %T %s: %v", o, o.GetName(), err)
	}
}

// bound creates a running pod that holds device index of n1.
func (c *cluster) bound(t *testing.T, ns, name, amount string, index int32) {
	t.Helper()
	p := pt.Held(name, "n1", amount, h100MiB, pt.DeviceUUID("n1", index))
	p.Namespace, p.UID = ns, ""
	p.Labels = map[string]string{v1alpha1.LabelQueue: ns}
	c.create(t, p)
	p.Status.Phase = corev1.PodRunning
	if err := c.admin.Status().Update(t.Context(), p); err != nil {
		t.Fatal(err)
	}
}

func (c *cluster) token(t *testing.T, ns, sa string) string {
	t.Helper()
	tr, err := c.cs.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// startShared runs the console as the chart does: shared mode, with the
// admin's credentials standing in for its ServiceAccount's, bearer tokens
// reviewed by the API server, every write impersonated.
// Each edit changes the configuration first.
func (c *cluster) startShared(t *testing.T, edits ...func(*console.Config)) *console.Instance {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	cfg := console.Config{Mode: console.ModeShared, Rest: c.cfg, Scheme: envtestutil.Scheme(),
		Addr: "127.0.0.1:0", Log: testr.New(t), AccessTTL: time.Millisecond}
	for _, edit := range edits {
		edit(&cfg)
	}
	inst, err := console.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := inst.Wait(); err != nil {
			t.Errorf("console: %v", err)
		}
	})
	return inst
}

// httpClient trusts the console's self-signed certificate: the test's own
// connection to a server it just started.
func httpClient() *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the console's self-signed test certificate
}

type answer struct {
	status int
	body   []byte
}

func (a answer) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(a.body, v); err != nil {
		t.Fatalf("decode %s: %v", a.body, err)
	}
}

func call(t *testing.T, base, method, path, token string, body any, headers ...string) answer {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, strings.TrimSuffix(base, "/")+path, r)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := httpClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, b}
}

// openNodesStream opens /api/v1/events for the nodes topic since version,
// as token, for 30 s at most, and returns a scanner of its lines.
func openNodesStream(t *testing.T, base, token string, version uint64) *bufio.Scanner {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", strings.TrimSuffix(base, "/")+fmt.Sprintf("/api/v1/events?topics=nodes&since=%d", version), nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := httpClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = resp.Body.Close() })
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("events: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	return sc
}

func wantStatus(t *testing.T, a answer, status int, what string) {
	t.Helper()
	if a.status != status {
		t.Fatalf("%s: HTTP %d, want %d: %s", what, a.status, status, a.body)
	}
}

func TestAPIShared(t *testing.T) {
	c := setup(t)
	inst := c.startShared(t)
	base := inst.URL
	alice, bob, admin := c.token(t, "team-a", "alice"), c.token(t, "team-b", "bob"), c.token(t, "default", "admin")

	t.Run("a request without a token is refused", func(t *testing.T) {
		a := call(t, base, "GET", "/api/v1/workloads", "", nil)
		wantStatus(t, a, http.StatusUnauthorized, "no token")
		a = call(t, base, "GET", "/api/v1/workloads", "not-a-token", nil)
		wantStatus(t, a, http.StatusUnauthorized, "a bad token")
	})

	t.Run("identity headers without the proxy's certificate are ignored", func(t *testing.T) {
		a := call(t, base, "GET", "/api/v1/workloads", "", nil, "X-Remote-User", "system:admin", "X-Remote-Group", "system:masters")
		wantStatus(t, a, http.StatusUnauthorized, "spoofed proxy headers")
	})

	t.Run("alice sees her namespace's workloads and none of team-b's", func(t *testing.T) {
		var wl console.WorkloadsView
		a := call(t, base, "GET", "/api/v1/workloads", alice, nil)
		wantStatus(t, a, http.StatusOK, "workloads")
		a.decode(t, &wl)
		var got []string
		for _, w := range wl.Workloads {
			got = append(got, w.Namespace+"/"+w.Name)
		}
		if diff := cmp.Diff([]string{"team-a/nb", "team-a/waiting"}, got); diff != "" {
			t.Errorf("alice's workloads (-want,+got):\n%s", diff)
		}
		a = call(t, base, "GET", "/api/v1/workloads/Pod/team-b/train", alice, nil)
		wantStatus(t, a, http.StatusNotFound, "team-b's workload")
		a = call(t, base, "GET", "/api/v1/pods/team-b/train/why", alice, nil)
		wantStatus(t, a, http.StatusNotFound, "why of team-b's pod")

		var m console.MapView
		call(t, base, "GET", "/api/v1/map", alice, nil).decode(t, &m)
		gpus := m.Nodes[0].GPUs
		if len(gpus[0].Slices) != 1 || gpus[0].Slices[0].Pod != "nb" || gpus[1].HiddenMilli != 1000 || len(gpus[1].Slices) != 0 {
			t.Errorf("alice's map: GPU 0 %+v, GPU 1 %+v; want her pod on 0 and a hidden whole GPU on 1", gpus[0], gpus[1])
		}
		if strings.Contains(string(call(t, base, "GET", "/api/v1/map", alice, nil).body), "train") {
			t.Errorf("alice's map names team-b's pod")
		}
	})

	t.Run("each sees the Models of the namespaces where they may list them", func(t *testing.T) {
		for _, tc := range []struct {
			who, token string
			want       []string
		}{{"alice", alice, []string{"team-a/llama"}}, {"bob", bob, nil}, {"admin", admin, []string{"team-a/llama", "team-b/llama"}}} {
			var r report.ModelsReport
			a := call(t, base, "GET", "/api/v1/models", tc.token, nil)
			wantStatus(t, a, http.StatusOK, tc.who+"'s models")
			a.decode(t, &r)
			var got []string
			for _, m := range r.Models {
				got = append(got, m.Namespace+"/"+m.Name)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("%s's models (-want,+got):\n%s", tc.who, diff)
			}
		}
	})

	t.Run("bob, who may list no pods, sees no workloads", func(t *testing.T) {
		var wl console.WorkloadsView
		call(t, base, "GET", "/api/v1/workloads", bob, nil).decode(t, &wl)
		if len(wl.Workloads) != 0 {
			t.Errorf("bob sees %d workloads", len(wl.Workloads))
		}
		var who console.Whoami
		call(t, base, "GET", "/api/v1/whoami", bob, nil).decode(t, &who)
		if who.User.Name != "system:serviceaccount:team-b:bob" || !who.Can["updateQueues"] {
			t.Errorf("whoami for bob: %+v", who)
		}
	})

	t.Run("alice may not edit a queue: no button, and the API server refuses", func(t *testing.T) {
		var who console.Whoami
		call(t, base, "GET", "/api/v1/whoami", alice, nil).decode(t, &who)
		if who.Can["updateQueues"] || who.Can["createQueues"] {
			t.Errorf("whoami offers alice queue edits: %+v", who.Can)
		}
		a := call(t, base, "PATCH", "/api/v1/queues/team-a", alice, map[string]any{"resources": map[string]any{"gpu": map[string]any{"quota": "3"}}})
		wantStatus(t, a, http.StatusForbidden, "alice's edit")
		var e console.APIError
		a.decode(t, &e)
		if !strings.Contains(e.Error.Message, `"system:serviceaccount:team-a:alice" cannot patch resource "queues"`) {
			t.Errorf("refusal %q does not carry the API server's words", e.Error.Message)
		}
		var q v1alpha1.Queue
		if err := c.admin.Get(t.Context(), client.ObjectKey{Name: "team-a"}, &q); err != nil {
			t.Fatal(err)
		}
		if got := q.Spec.Resources.GPU.Quota.String(); got != "2" {
			t.Errorf("team-a's quota is %s after a refused edit, want 2", got)
		}
	})

	t.Run("bob edits a queue's quota as himself", func(t *testing.T) {
		var qs console.QueuesView
		call(t, base, "GET", "/api/v1/queues", bob, nil).decode(t, &qs)
		rv := ""
		for _, q := range qs.Queues {
			if q.Name == "team-a" {
				rv = q.ResourceVersion
			}
		}
		a := call(t, base, "PATCH", "/api/v1/queues/team-a", bob, map[string]any{"resourceVersion": rv,
			"resources": map[string]any{"gpu": map[string]any{"quota": "3", "overQuotaWeight": 4}}})
		wantStatus(t, a, http.StatusOK, "bob's edit")
		var q v1alpha1.Queue
		if err := c.admin.Get(t.Context(), client.ObjectKey{Name: "team-a"}, &q); err != nil {
			t.Fatal(err)
		}
		g := q.Spec.Resources.GPU
		if g.Quota.String() != "3" || g.Limit.String() != "3" || *g.OverQuotaWeight != 4 {
			t.Errorf("team-a gpu after the edit: quota %s limit %s weight %d, want 3 3 4", g.Quota, g.Limit, *g.OverQuotaWeight)
		}
		a = call(t, base, "PATCH", "/api/v1/queues/team-a", bob, map[string]any{"resourceVersion": rv, "resources": map[string]any{"gpu": map[string]any{"quota": "1"}}})
		wantStatus(t, a, http.StatusConflict, "an edit of a stale version")
		a = call(t, base, "PATCH", "/api/v1/queues/team-a", bob, map[string]any{"resources": map[string]any{"gpu": map[string]any{"quota": "9"}}})
		wantStatus(t, a, http.StatusUnprocessableEntity, "a quota above the limit (the CRD's CEL rule)")
		a = call(t, base, "PATCH", "/api/v1/queues/team-a", bob, map[string]any{"resources": map[string]any{"gpu": map[string]any{"quota": "four"}}})
		wantStatus(t, a, http.StatusBadRequest, "a quota that is no quantity")
	})

	t.Run("bob creates a queue", func(t *testing.T) {
		a := call(t, base, "POST", "/api/v1/queues", bob, map[string]any{"name": "team-c", "parent": "", "namespaces": []string{"team-c"},
			"resources": map[string]any{"gpu": map[string]any{"quota": "1", "limit": "-1"}}})
		wantStatus(t, a, http.StatusCreated, "create")
		a = call(t, base, "POST", "/api/v1/queues", alice, map[string]any{"name": "team-d"})
		wantStatus(t, a, http.StatusForbidden, "alice's create")
	})

	t.Run("alice submits a workload in her namespace, not in team-b", func(t *testing.T) {
		a := call(t, base, "POST", "/api/v1/workloads", alice, map[string]any{"namespace": "team-a", "name": "notebook", "image": "busybox", "gpuFraction": "0.5", "queue": "team-a"})
		wantStatus(t, a, http.StatusCreated, "submit")
		var p corev1.Pod
		if err := c.admin.Get(t.Context(), client.ObjectKey{Namespace: "team-a", Name: "notebook"}, &p); err != nil {
			t.Fatal(err)
		}
		if p.Annotations[v1alpha1.AnnotationGPUFraction] != "0.5" || p.Labels[v1alpha1.LabelQueue] != "team-a" {
			t.Errorf("submitted pod: annotations %v labels %v", p.Annotations, p.Labels)
		}
		a = call(t, base, "POST", "/api/v1/workloads", alice, map[string]any{"namespace": "team-b", "image": "busybox", "gpus": 1})
		wantStatus(t, a, http.StatusForbidden, "submit in team-b")
		a = call(t, base, "POST", "/api/v1/workloads", alice, map[string]any{"namespace": "team-a", "image": "busybox", "gpuFraction": "0.5", "gpus": 2})
		wantStatus(t, a, http.StatusBadRequest, "two GPU amounts")
		a = call(t, base, "POST", "/api/v1/workloads", alice, map[string]any{"namespace": "team-a", "image": "busybox", "gpuFraction": "1.5"})
		wantStatus(t, a, http.StatusUnprocessableEntity, "a fraction above 1")
	})

	t.Run("alice may not delete team-b's workload; she deletes her own", func(t *testing.T) {
		a := call(t, base, "DELETE", "/api/v1/workloads/Pod/team-b/train", alice, nil)
		wantStatus(t, a, http.StatusForbidden, "delete team-b's pod")
		if err := c.admin.Get(t.Context(), client.ObjectKey{Namespace: "team-b", Name: "train"}, &corev1.Pod{}); err != nil {
			t.Errorf("team-b's pod after alice's refused delete: %v", err)
		}
		a = call(t, base, "DELETE", "/api/v1/workloads/Pod/team-a/notebook", alice, nil)
		wantStatus(t, a, http.StatusOK, "delete her pod")
		err := c.admin.Get(t.Context(), client.ObjectKey{Namespace: "team-a", Name: "notebook"}, &corev1.Pod{})
		if !apierrors.IsNotFound(err) {
			var p corev1.Pod
			_ = c.admin.Get(t.Context(), client.ObjectKey{Namespace: "team-a", Name: "notebook"}, &p)
			if p.DeletionTimestamp == nil {
				t.Errorf("her pod after delete: %v", err)
			}
		}
		a = call(t, base, "POST", "/api/v1/workloads/Pod/team-a/nb/suspend", alice, nil)
		wantStatus(t, a, http.StatusUnprocessableEntity, "suspend a pod")
	})

	t.Run("why gives kubectl partita why's verdict", func(t *testing.T) {
		// The console answers from its informers, a moment behind the API
		// server after the edits above: the two agree once it has caught up.
		var want, got report.WhyReport
		diff := ""
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			a := call(t, base, "GET", "/api/v1/pods/team-a/waiting/why", alice, nil)
			wantStatus(t, a, http.StatusOK, "why")
			a.decode(t, &got)
			var buf bytes.Buffer
			if err := ctl.RunWhy(t.Context(), c.admin, &buf, "team-a", "waiting", ctl.OutputJSON, time.Now()); err != nil {
				t.Fatal(err)
			}
			want = report.WhyReport{}
			if err := json.Unmarshal(buf.Bytes(), &want); err != nil {
				t.Fatal(err)
			}
			if diff = cmp.Diff(want, got); diff == "" || time.Now().After(deadline) {
				break
			}
		}
		if diff != "" {
			t.Errorf("why (-kubectl partita why,+console):\n%s", diff)
		}
		// The notebook deleted above may still be in the console's
		// informers a moment.
		var wl console.WorkloadsView
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			wl = console.WorkloadsView{}
			call(t, base, "GET", "/api/v1/workloads?phase=Waiting", alice, nil).decode(t, &wl)
			if len(wl.Workloads) == 1 || time.Now().After(deadline) {
				break
			}
		}
		if len(wl.Workloads) != 1 || wl.Workloads[0].Verdict != want.Summary {
			t.Errorf("the list's verdict %+v, want %q", wl.Workloads, want.Summary)
		}
	})

	t.Run("a write from another site is refused", func(t *testing.T) {
		a := call(t, base, "PATCH", "/api/v1/queues/team-a", bob, map[string]any{"resources": map[string]any{"gpu": map[string]any{"quota": "1"}}},
			"Sec-Fetch-Site", "cross-site", "Origin", "https://evil.example")
		wantStatus(t, a, http.StatusForbidden, "a cross-site write")
	})

	t.Run("admin's stream shows a new pod on its GPU", func(t *testing.T) {
		var m console.MapView
		call(t, base, "GET", "/api/v1/map", admin, nil).decode(t, &m)
		sc := openNodesStream(t, base, admin, m.Version)
		c.bound(t, "team-a", "late", "0.5", 2)
		var seen []string
		for sc.Scan() {
			line := sc.Text()
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok {
				continue
			}
			seen = append(seen, data)
			var ev console.NodesEvent
			if json.Unmarshal([]byte(data), &ev) != nil || len(ev.Nodes) == 0 {
				continue
			}
			for _, s := range ev.Nodes[0].GPUs[2].Slices {
				if s.Pod == "late" {
					return
				}
			}
		}
		t.Fatalf("no nodes event with team-a/late on GPU 2 (%v); saw %v", sc.Err(), seen)
	})

	t.Run("a gang offers delete only to who may delete its pods and its PodGroup", func(t *testing.T) {
		c.create(t, pt.MakePodGroup("gang", "team-a").MinMember(1).Queue("team-a").Obj())
		c.create(t, pt.MakePod("gang-0", "team-a").GPUFraction("0.5").PodGroup("gang").Queue("team-a").Obj())
		actions := func(token string) []string {
			var got []string
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				var w console.WorkloadDetail
				if a := call(t, base, "GET", "/api/v1/workloads/PodGroup/team-a/gang", token, nil); a.status == http.StatusOK {
					a.decode(t, &w)
					return w.Workload.Actions
				}
			}
			t.Fatalf("the gang never showed")
			return got
		}
		// alice may delete pods in team-a, not PodGroups.
		if got := actions(alice); len(got) != 0 {
			t.Errorf("alice is offered %v on the gang", got)
		}
		if got := actions(admin); len(got) != 1 || got[0] != console.ActionDelete {
			t.Errorf("admin is offered %v on the gang, want delete", got)
		}
	})

	t.Run("why reads the claims of a pod that asks for GPUs through them", func(t *testing.T) {
		c.create(t, pt.MakeResourceClaim("train-gpu", "team-a").Devices("gpu", "gpu.nvidia.com", 1).Obj())
		c.create(t, pt.MakePod("claimer", "team-a").Queue("team-a").Claim("gpu", "train-gpu").Obj())
		want := "asks for 1 GPU through ResourceClaims (claim train-gpu: 1 × gpu.nvidia.com)"
		var got report.WhyReport
		request := ""
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && request != want; time.Sleep(200 * time.Millisecond) {
			a := call(t, base, "GET", "/api/v1/pods/team-a/claimer/why", alice, nil)
			if a.status != http.StatusOK {
				request = string(a.body)
				continue
			}
			a.decode(t, &got)
			for _, f := range got.Findings {
				if f.Check == report.CheckRequest {
					request = f.Message
				}
			}
		}
		if request != want {
			t.Errorf("the console's why says %q of the request, want %q (report %+v)", request, want, got)
		}
	})

	t.Run("the map groups nodes by the levels of a Topology, for who may list Topologies", func(t *testing.T) {
		const block, rack = "example.com/block", "example.com/rack"
		gn := pt.MakeGPUNode("n2").Devices(2, "NVIDIA-H100-80GB-HBM3", h100MiB).Obj()
		st := gn.Status
		c.create(t, gn)
		gn.Status = st
		if err := c.admin.Status().Update(t.Context(), gn); err != nil {
			t.Fatal(err)
		}
		c.create(t, pt.MakeNode("n1").Label(block, "b1").Label(rack, "r1").Label("unrelated", "x").Obj())
		// n2 has a block and no rack.
		c.create(t, pt.MakeNode("n2").Label(block, "b2").Obj())
		var m console.MapView
		call(t, base, "GET", "/api/v1/map", admin, nil).decode(t, &m)
		sc := openNodesStream(t, base, admin, m.Version)
		c.create(t, pt.MakeTopology("gb200", block, rack).Obj())
		// The open page is told to read the map again: its choice of
		// Topologies changed.
		resync := false
		for !resync && sc.Scan() {
			resync = sc.Text() == "event: resync"
		}
		if !resync {
			t.Fatalf("no resync event after a Topology was created (%v)", sc.Err())
		}

		// n1's numbers are what the map shows of it: the subtests before
		// this one put pods on it.
		want := func(n1 console.MapNode) []console.MapDomain {
			var used, free int64
			for _, g := range n1.GPUs {
				used, free = used+g.UsedMilli, free+g.FreeMilli
			}
			return []console.MapDomain{
				{Level: block, Value: "b1", NodeCount: 1, GPUs: 4, HealthyGPUs: 4, UsedMilli: used, FreeMilli: free, Domains: []console.MapDomain{
					{Level: rack, Value: "r1", NodeCount: 1, GPUs: 4, HealthyGPUs: 4, UsedMilli: used, FreeMilli: free, Nodes: []string{"n1"}},
				}},
				{Level: block, Value: "b2", NodeCount: 1, GPUs: 2, HealthyGPUs: 2, FreeMilli: 2000, Domains: []console.MapDomain{
					{Level: rack, Missing: true, NodeCount: 1, GPUs: 2, HealthyGPUs: 2, FreeMilli: 2000, Nodes: []string{"n2"}},
				}},
			}
		}
		diff := ""
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			m = console.MapView{}
			a := call(t, base, "GET", "/api/v1/map?topology=gb200", admin, nil)
			if a.status == http.StatusOK {
				a.decode(t, &m)
				diff = cmp.Diff(want(m.Nodes[0]), m.Domains)
			} else {
				diff = string(a.body)
			}
			if diff == "" || time.Now().After(deadline) {
				break
			}
		}
		if diff != "" {
			t.Fatalf("admin's map by gb200 (-want,+got):\n%s", diff)
		}
		if diff := cmp.Diff([]console.TopologyView{{Name: "gb200", Levels: []string{block, rack}}}, m.Topologies); diff != "" {
			t.Errorf("admin's topologies (-want,+got):\n%s", diff)
		}
		labels := map[string]map[string]string{}
		for _, n := range m.Nodes {
			labels[n.Name] = n.Labels
		}
		if diff := cmp.Diff(map[string]map[string]string{"n1": {block: "b1", rack: "r1"}, "n2": {block: "b2"}}, labels); diff != "" {
			t.Errorf("the nodes' level labels (-want,+got):\n%s", diff)
		}

		a := call(t, base, "GET", "/api/v1/map?topology=gb300", admin, nil)
		wantStatus(t, a, http.StatusNotFound, "a Topology that is not there")
		var e console.APIError
		a.decode(t, &e)
		if want := `read Topology "gb300": topology not found; the cluster has gb200 (kubectl get topologies)`; e.Error.Message != want {
			t.Errorf("not found says %q, want %q", e.Error.Message, want)
		}

		// alice may not list Topologies: she gets none, nor the labels.
		a = call(t, base, "GET", "/api/v1/map?topology=gb200", alice, nil)
		wantStatus(t, a, http.StatusForbidden, "alice's map by a Topology")
		m = console.MapView{}
		call(t, base, "GET", "/api/v1/map", alice, nil).decode(t, &m)
		if len(m.Topologies) != 0 || m.Nodes[0].Labels != nil {
			t.Errorf("alice's map offers topologies %v and labels %v", m.Topologies, m.Nodes[0].Labels)
		}
	})
}

func TestAPILocalUserWithOneNamespace(t *testing.T) {
	c := setup(t)
	// carol may list pods in team-a only and may not list namespaces: the
	// console finds team-a from her kubeconfig's namespace and watches it
	// alone, with her credentials.
	u, err := c.env.AddUser(envtest.User{Name: "carol"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.create(t, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "carol-gpu-viewer"},
		RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "gpu-viewer"}, Subjects: []rbacv1.Subject{{Kind: "User", Name: "carol"}}})
	c.create(t, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "carol"},
		RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "worker"}, Subjects: []rbacv1.Subject{{Kind: "User", Name: "carol"}}})
	// The agent's report of team-b's slice, which carol's informers cannot see.
	var gn v1alpha1.GPUNode
	if err := c.admin.Get(t.Context(), client.ObjectKey{Name: "n1"}, &gn); err != nil {
		t.Fatal(err)
	}
	gn.Status.Slices = []v1alpha1.GPUSlice{{Namespace: "team-b", Pod: "train", Container: "main", DeviceIndex: 1, Milli: 1000}}
	if err := c.admin.Status().Update(t.Context(), &gn); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	inst, err := console.Start(ctx, console.Config{Mode: console.ModeLocal, Rest: u.Config(), Scheme: envtestutil.Scheme(),
		DefaultNamespace: "team-a", Addr: "127.0.0.1:0", Log: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	base := strings.SplitN(inst.URL, "#", 2)[0]
	if !strings.HasPrefix(inst.URL, "http://127.0.0.1:") || !strings.Contains(inst.URL, "/#token="+inst.Token) {
		t.Errorf("URL %q", inst.URL)
	}

	t.Run("the page loads without the token; the API needs it", func(t *testing.T) {
		a := call(t, base, "GET", "/", "", nil)
		wantStatus(t, a, http.StatusOK, "the page")
		a = call(t, base, "GET", "/api/v1/map", "", nil)
		wantStatus(t, a, http.StatusUnauthorized, "no token")
		a = call(t, base, "GET", "/api/v1/map", "guess", nil)
		wantStatus(t, a, http.StatusUnauthorized, "a wrong token")
	})

	t.Run("another Host header is refused (DNS rebinding)", func(t *testing.T) {
		req, _ := http.NewRequestWithContext(t.Context(), "GET", base+"api/v1/map", nil)
		req.Host = "evil.example:80"
		req.Header.Set("Authorization", "Bearer "+inst.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusMisdirectedRequest {
			t.Errorf("Host evil.example: HTTP %d, want 421", resp.StatusCode)
		}
	})

	t.Run("carol sees team-a, and team-b's GPU as taken", func(t *testing.T) {
		var who console.Whoami
		call(t, base, "GET", "/api/v1/whoami", inst.Token, nil).decode(t, &who)
		if who.User.Name != "carol" || who.Mode != console.ModeLocal {
			t.Errorf("whoami %+v", who)
		}
		var wl console.WorkloadsView
		call(t, base, "GET", "/api/v1/workloads", inst.Token, nil).decode(t, &wl)
		for _, w := range wl.Workloads {
			if w.Namespace != "team-a" {
				t.Errorf("carol sees %s/%s", w.Namespace, w.Name)
			}
		}
		if len(wl.Workloads) != 2 {
			t.Errorf("carol sees %d workloads, want team-a's 2", len(wl.Workloads))
		}
		var m console.MapView
		call(t, base, "GET", "/api/v1/map", inst.Token, nil).decode(t, &m)
		if g := m.Nodes[0].GPUs[1]; g.HiddenMilli != 1000 || g.FreeMilli != 0 {
			t.Errorf("GPU 1 for carol: %+v, want 1000 hidden", g)
		}
	})

	t.Run("carol may not change a queue", func(t *testing.T) {
		a := call(t, base, "PATCH", "/api/v1/queues/team-a", inst.Token, map[string]any{"priority": 5})
		wantStatus(t, a, http.StatusForbidden, "carol's edit")
	})
}
