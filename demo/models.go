package demo

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/ctl"
	"github.com/partita-dev/partita/models/safetensors"
)

// The model of the models step: two safetensors shards of demoShardTensors
// BF16 tensors of 4096 × 2048 (16 MiB each), written once into the
// cluster's model-files directory and kept across runs.
const (
	demoModel        = "demo-llm"
	demoShards       = 2
	demoShardTensors = 8
	roleInference    = "inference"
	// modelTimeout bounds the wait for a node's cache to fetch the model.
	modelTimeout = 2 * time.Minute
)

// models is a step between the notebooks and the gang: an inference
// service's replicas ask for a Model; the first replica's node fetches it
// when the replica is admitted, and the second replica goes where the model
// already is. The replicas leave at the end of the step (their GPUs are
// the rest of the story's); the model stays cached on its node.
func (s *story) models(ctx context.Context) error {
	dir := filepath.Join(s.c.ModelFilesDir(), demoModel)
	size, files, err := writeDemoModel(dir)
	if err != nil {
		return fmt.Errorf("write the demo's model files: %w", err)
	}
	m := &v1alpha1.Model{
		ObjectMeta: metav1.ObjectMeta{Namespace: TeamA, Name: demoModel},
		Spec:       v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: "file://" + dir}},
	}
	if err := s.cl.Create(ctx, m); err != nil {
		return fmt.Errorf("create Model %s/%s: %w", TeamA, demoModel, err)
	}
	s.say("  Model %s/%s: %d files, %.1f MB, at %s", TeamA, demoModel, files, float64(size)/1e6, m.Spec.Source.URI)
	s.say("  (a directory every node mounts, say; s3:// and http(s):// sources work the same). No node holds it yet.")

	replica := func(name string) *corev1.Pod {
		p := fractionPod(TeamA, name, roleInference, "0.5")
		p.Annotations[v1alpha1.AnnotationModel] = demoModel
		return p
	}
	if err := s.createPods(ctx, replica("llm-0")); err != nil {
		return err
	}
	bound, err := s.waitBound(ctx, TeamA, []string{"llm-0"})
	if err != nil {
		return err
	}
	first := bound[0].Spec.NodeName
	s.say("  Replica llm-0 (half a GPU, annotation %s: %s) is admitted to %s,", v1alpha1.AnnotationModel, demoModel, first)
	s.say("  and Partita asks %s's model cache to fetch %s at once, before the pod binds.", first, demoModel)
	entry, err := s.waitModelOn(ctx, first)
	if err != nil {
		return err
	}
	if entry.Message == "cached" {
		s.say("  %s's cache already held %s (an earlier run fetched it): ready at once.", first, demoModel)
	} else {
		s.say("  %s's cache %s (every file's SHA-256 taken, safetensors headers checked).", first, entry.Message)
	}
	s.say("  On a real node the kubelet starts llm-0's container only now, with the files read-only at")
	s.say("  /models/%s; kwok's simulated pods do not wait.", demoModel)

	if err := s.createPods(ctx, replica("llm-1")); err != nil {
		return err
	}
	bound, err = s.waitBound(ctx, TeamA, []string{"llm-1"})
	if err != nil {
		return err
	}
	second := bound[0].Spec.NodeName
	if second != first {
		return fmt.Errorf("replica llm-1 was placed on %s, not on %s, which holds %s", second, first, demoModel)
	}
	got := &v1alpha1.Model{}
	if err := s.cl.Get(ctx, client.ObjectKeyFromObject(m), got); err != nil {
		return fmt.Errorf("read Model %s/%s: %w", TeamA, demoModel, err)
	}
	if n := len(got.Status.Nodes); n != 1 {
		return fmt.Errorf("the Model %s/%s is on %d nodes, want only %s: %+v", TeamA, demoModel, n, first, got.Status.Nodes)
	}
	s.say("  A second replica, llm-1, goes to %s too, where %s already is: its container would start", second, demoModel)
	s.say("  at once, from the node's cache, without a byte from the source. kubectl partita models %s -n %s:", demoModel, TeamA)
	if err := ctl.RunModels(ctx, s.cl, indent(s.opts.Out), TeamA, demoModel, ctl.OutputTable); err != nil {
		return err
	}

	// The replicas leave; the model stays in the node's cache.
	for _, name := range []string{"llm-0", "llm-1"} {
		if err := s.cs.CoreV1().Pods(TeamA).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete pod %s/%s: %w", TeamA, name, err)
		}
		if err := waitGone(ctx, "pod "+TeamA+"/"+name+" deleted", func(ctx context.Context) error {
			_, err := s.cs.CoreV1().Pods(TeamA).Get(ctx, name, metav1.GetOptions{})
			return err
		}); err != nil {
			return err
		}
	}
	s.say("  The replicas are deleted (their GPUs are for the rest of the story); %s stays cached on %s.", demoModel, first)
	return nil
}

// waitModelOn waits until node's copy of the demo's Model is Ready, and
// returns its entry. A Failed copy ends the wait with its message.
func (s *story) waitModelOn(ctx context.Context, node string) (v1alpha1.ModelNodeStatus, error) {
	var entry v1alpha1.ModelNodeStatus
	err := waitFor(ctx, modelTimeout, fmt.Sprintf("%s's model cache holding %s", node, demoModel), func(ctx context.Context) error {
		m := &v1alpha1.Model{}
		if err := s.cl.Get(ctx, client.ObjectKey{Namespace: TeamA, Name: demoModel}, m); err != nil {
			return err
		}
		e := m.Status.ModelNode(node)
		switch {
		case e == nil:
			return seen("no entry for %s in status.nodes: %+v", node, m.Status.Nodes)
		case e.Phase == v1alpha1.ModelFailed:
			return fmt.Errorf("%s could not fetch %s: %s", node, demoModel, e.Message)
		case e.Phase != v1alpha1.ModelReady:
			return seen("%s: %s", e.Phase, e.Message)
		}
		entry = *e
		return nil
	})
	return entry, err
}

// writeDemoModel writes the demo's model into dir unless a run before did,
// and returns its size and number of files. The files are written under
// a temporary name and renamed, so a file that is there is whole; they are
// never rewritten, so the model's version (and the nodes' cached copies)
// stay the same from run to run.
func writeDemoModel(dir string) (int64, int, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, 0, err
	}
	var total int64
	for i := 1; i <= demoShards; i++ {
		n, err := writeShard(filepath.Join(dir, fmt.Sprintf("model-%05d-of-%05d.safetensors", i, demoShards)), uint64(i))
		if err != nil {
			return 0, 0, err
		}
		total += n
	}
	cfg := filepath.Join(dir, "config.json")
	body := fmt.Sprintf(`{"architectures": ["DemoForCausalLM"], "hidden_size": 4096, "num_hidden_layers": %d, "torch_dtype": "bfloat16"}`+"\n", demoShards*demoShardTensors/2)
	if _, err := os.Stat(cfg); errors.Is(err, os.ErrNotExist) {
		if err := writeWhole(cfg, func(w *bufio.Writer) error { _, err := w.WriteString(body); return err }); err != nil {
			return 0, 0, err
		}
	} else if err != nil {
		return 0, 0, err
	}
	fi, err := os.Stat(cfg)
	if err != nil {
		return 0, 0, err
	}
	return total + fi.Size(), demoShards + 1, nil
}

// writeShard writes one shard of random BF16 weights (seeded: the same
// bytes every time) unless it is there, and returns its size.
func writeShard(path string, seed uint64) (int64, error) {
	if fi, err := os.Stat(path); err == nil {
		return fi.Size(), nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return 0, err
	}
	var ts []safetensors.Tensor
	for l := range demoShardTensors {
		layer := (int(seed)-1)*demoShardTensors/2 + l/2
		kind := []string{"self_attn.o_proj", "mlp.down_proj"}[l%2]
		ts = append(ts, safetensors.Tensor{Name: fmt.Sprintf("model.layers.%d.%s.weight", layer, kind), DType: "BF16", Shape: []uint64{4096, 2048}})
	}
	laid, dataLen, err := safetensors.Layout(ts)
	if err != nil {
		return 0, err
	}
	rng := rand.NewChaCha8([32]byte{byte(seed)})
	err = writeWhole(path, func(w *bufio.Writer) error {
		if err := safetensors.WriteHeader(w, map[string]string{"format": "pt"}, laid); err != nil {
			return err
		}
		buf := make([]byte, 1<<20)
		for left := dataLen; left > 0; {
			n := min(uint64(len(buf)), left)
			_, _ = rng.Read(buf[:n])
			if _, err := w.Write(buf[:n]); err != nil {
				return err
			}
			left -= n
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// writeWhole writes path through a temporary file renamed into place.
func writeWhole(path string, write func(*bufio.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	w := bufio.NewWriterSize(tmp, 1<<20)
	if err := write(w); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := w.Flush(); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return os.Rename(tmp.Name(), path)
}
