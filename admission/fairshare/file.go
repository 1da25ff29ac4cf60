package fairshare

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"
)

// Input is the content of a fair-share file: what Divide needs.
type Input struct {
	Capacity map[Resource]float64
	// Queues in creation order: CreationOrder is the index in the file.
	Queues []Queue
	Demand map[string]map[Resource]float64
	// UsageWeight is Options.UsageWeight: how much the queues' usage counts.
	UsageWeight float64
}

// Divide divides in.Capacity among in.Queues for in.Demand.
func (in Input) Divide() (Division, error) {
	return DivideWith(in.Capacity, in.Queues, in.Demand, Options{UsageWeight: in.UsageWeight})
}

// fileResources lists the resources a file may name, for error messages.
const fileResources = "gpu, cpu, memory"

// Load reads a fair-share file, YAML or JSON:
//
//	capacity: {gpu: 16, cpu: 64, memory: 512Gi}
//	queues:            # in creation order
//	- {name: org, priority: 100, gpu: {quota: 8, limit: -1, overQuotaWeight: 1}}
//	- {name: team-a, parent: org, gpu: {quota: 4, overQuotaWeight: 2}}
//	demand: {team-a: {gpu: 10, memory: 64Gi}}
//	usageWeight: 1     # optional: weigh history (see Options)
//
// Every key of a queue other than name, parent, priority and usage is a
// resource (gpu, cpu or memory) with quota (default 0), limit (default -1)
// and overQuotaWeight (default 1); priority defaults to DefaultPriority.
// usage maps resources to the queue's normalized usage, a share of the
// cluster's capacity over the window such as {gpu: 0.4}, as Queue status
// shows it (status.usage.share); a parent that gives none gets the sum of
// its children's. Usage counts only with a usageWeight above 0. Amounts
// are numbers or Kubernetes quantities ("500m", "64Gi"): GPUs, CPU cores and
// memory bytes. demand may name only leaf queues. Load rejects unknown fields
// and anything Divide would reject, naming the field at fault.
func Load(r io.Reader) (Input, error) {
	raw, err := io.ReadAll(r)
	if err != nil {
		return Input{}, fmt.Errorf("read fair-share file: %w", err)
	}
	// Strict: a key given twice is an error, not a silent override.
	js, err := yaml.YAMLToJSONStrict(raw)
	if err != nil {
		return Input{}, fmt.Errorf("parse fair-share file: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	// Numbers stay text so that 0.1 reaches ParseQuantity as written.
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return Input{}, fmt.Errorf("parse fair-share file: %w", err)
	}
	in, err := inputFrom(doc)
	if err != nil {
		return Input{}, err
	}
	if _, err := newTree(in.Capacity, in.Queues, in.Demand); err != nil {
		return Input{}, err
	}
	return in, nil
}

func inputFrom(doc any) (Input, error) {
	top, ok := doc.(map[string]any)
	if !ok {
		if doc == nil {
			return Input{}, invalid("file", "is empty; want capacity, queues and demand")
		}
		return Input{}, invalid("file", "must be a mapping with capacity, queues and demand")
	}
	in := Input{Demand: map[string]map[Resource]float64{}}
	for _, key := range sortedKeys(top) {
		if key != "capacity" && key != "queues" && key != "demand" && key != "usageWeight" {
			return Input{}, invalid("file", "unknown field %q; want capacity, queues, demand or usageWeight", key)
		}
	}
	if v, ok := top["usageWeight"]; ok {
		k, err := weightFrom(v)
		if err == nil {
			err = checkAmount(k, false)
		}
		if err != nil {
			return Input{}, invalid("usageWeight", "%v", err)
		}
		in.UsageWeight = k
	}
	var err error
	if in.Capacity, err = amounts("capacity", top["capacity"]); err != nil {
		return Input{}, err
	}
	if len(in.Capacity) == 0 {
		return Input{}, invalid("capacity", "is required: give at least one of gpu, cpu or memory")
	}
	list, ok := top["queues"].([]any)
	if !ok || len(list) == 0 {
		return Input{}, invalid("queues", "is required: a list of queues in creation order")
	}
	for i, item := range list {
		q, err := queueFrom(fmt.Sprintf("queues[%d]", i), item)
		if err != nil {
			return Input{}, err
		}
		q.CreationOrder = i
		in.Queues = append(in.Queues, q)
	}
	if top["demand"] != nil {
		byQueue, ok := top["demand"].(map[string]any)
		if !ok {
			return Input{}, invalid("demand", "must map queue names to amounts, such as {team-a: {gpu: 2}}")
		}
		for _, name := range sortedKeys(byQueue) {
			a, err := amounts("demand."+name, byQueue[name])
			if err != nil {
				return Input{}, err
			}
			in.Demand[name] = a
		}
	}
	return in, nil
}

func queueFrom(path string, item any) (Queue, error) {
	fields, ok := item.(map[string]any)
	if !ok {
		return Queue{}, invalid(path, "must be a mapping such as {name: team-a, gpu: {quota: 4}}")
	}
	q := Queue{Priority: DefaultPriority, Resources: map[Resource]Settings{}}
	name, ok := fields["name"].(string)
	if !ok || name == "" {
		return Queue{}, invalid(path+".name", "is required: a queue name such as team-a")
	}
	q.Name = name
	path = fmt.Sprintf("%s (%s)", path, name)
	for _, key := range sortedKeys(fields) {
		v := fields[key]
		switch key {
		case "name":
		case "parent":
			parent, ok := v.(string)
			if !ok {
				return Queue{}, invalid(path+".parent", "must be a queue name")
			}
			q.Parent = parent
		case "priority":
			p, err := priorityFrom(v)
			if err != nil {
				return Queue{}, invalid(path+".priority", "%v", err)
			}
			q.Priority = p
		case "usage":
			u, err := amounts(path+".usage", v)
			if err != nil {
				return Queue{}, err
			}
			q.Usage = u
		default:
			r, ok := resourceFrom(key)
			if !ok {
				return Queue{}, invalid(path, "unknown field %q; want name, parent, priority, usage or a resource (%s)", key, fileResources)
			}
			s, err := settingsFrom(path+"."+key, v)
			if err != nil {
				return Queue{}, err
			}
			q.Resources[r] = s
		}
	}
	return q, nil
}

func settingsFrom(path string, v any) (Settings, error) {
	fields, ok := v.(map[string]any)
	if !ok {
		return Settings{}, invalid(path, "must be a mapping such as {quota: 4, limit: -1, overQuotaWeight: 1}")
	}
	s := DefaultSettings()
	for _, key := range sortedKeys(fields) {
		v := fields[key]
		var err error
		switch key {
		case "quota":
			s.Quota, err = quantityFrom(v)
		case "limit":
			s.Limit, err = quantityFrom(v)
		case "overQuotaWeight":
			s.OverQuotaWeight, err = weightFrom(v)
		default:
			return Settings{}, invalid(path, "unknown field %q; want quota, limit or overQuotaWeight", key)
		}
		if err != nil {
			return Settings{}, invalid(path+"."+key, "%v", err)
		}
	}
	return s, nil
}

// amounts reads a mapping of resource to quantity, such as capacity.
func amounts(path string, v any) (map[Resource]float64, error) {
	out := map[Resource]float64{}
	if v == nil {
		return out, nil
	}
	fields, ok := v.(map[string]any)
	if !ok {
		return nil, invalid(path, "must map resources to amounts, such as {gpu: 8, memory: 64Gi}")
	}
	for _, key := range sortedKeys(fields) {
		v := fields[key]
		r, ok := resourceFrom(key)
		if !ok {
			return nil, invalid(path, "unknown resource %q; want %s", key, fileResources)
		}
		a, err := quantityFrom(v)
		if err != nil {
			return nil, invalid(path+"."+key, "%v", err)
		}
		out[r] = a
	}
	return out, nil
}

func resourceFrom(key string) (Resource, bool) {
	switch r := Resource(key); r {
	case GPU, CPU, Memory:
		return r, true
	}
	return "", false
}

// sortedKeys makes errors about several bad keys name the same one every run.
func sortedKeys(m map[string]any) []string {
	return slices.Sorted(maps.Keys(m))
}

// quantityFrom reads a number or a Kubernetes quantity. The value goes through
// its decimal text, so "0.1" becomes the float64 nearest to 0.1 and Divide
// reads it back as exactly 1/10.
func quantityFrom(v any) (float64, error) {
	var text string
	switch v := v.(type) {
	case json.Number:
		text = v.String()
	case string:
		text = v
	default:
		return 0, fmt.Errorf("want a number (4, 0.5, -1) or a quantity (500m, 64Gi), got %v", v)
	}
	q, err := resource.ParseQuantity(text)
	if err != nil {
		return 0, fmt.Errorf("%q is not a number (4, 0.5, -1) or a quantity (500m, 64Gi)", text)
	}
	f, err := strconv.ParseFloat(q.AsDec().String(), 64)
	if err != nil || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%q is out of range", text)
	}
	return f, nil
}

func weightFrom(v any) (float64, error) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, fmt.Errorf("want a number such as 1 or 2, got %v", v)
	}
	return n.Float64()
}

func priorityFrom(v any) (int32, error) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, fmt.Errorf("want a whole number such as 100, got %v", v)
	}
	p, err := strconv.ParseInt(n.String(), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("want a whole number such as 100, got %v", n)
	}
	return int32(p), nil
}
