package fairshare

import (
	"fmt"
	"testing"
)

// BenchmarkDivide divides gpu, cpu and memory among 10 departments × 10 teams
// × 10 projects (1,110 queues), the size of a large cluster's queue tree.
func BenchmarkDivide(b *testing.B) {
	capacity := map[Resource]float64{GPU: 1000, CPU: 64000, Memory: 1 << 44}
	var queues []Queue
	demand := map[string]map[Resource]float64{}
	add := func(name, parent string, i int) {
		queues = append(queues, Queue{
			Name: name, Parent: parent, Priority: int32(50 * (1 + i%3)), CreationOrder: len(queues),
			Resources: map[Resource]Settings{
				GPU: {Quota: float64(i % 4), Limit: Unlimited, OverQuotaWeight: float64(1 + i%3)},
				CPU: {Quota: float64(10 * (i % 5)), Limit: Unlimited, OverQuotaWeight: 1},
			},
		})
	}
	for d := range 10 {
		dept := fmt.Sprintf("dept-%d", d)
		add(dept, "", d)
		for t := range 10 {
			team := fmt.Sprintf("%s-team-%d", dept, t)
			add(team, dept, t)
			for p := range 10 {
				project := fmt.Sprintf("%s-project-%d", team, p)
				add(project, team, p)
				demand[project] = map[Resource]float64{GPU: float64(p) + 0.5, CPU: float64(100 * p), Memory: float64(p << 30)}
			}
		}
	}
	for b.Loop() {
		if _, err := Divide(capacity, queues, demand); err != nil {
			b.Fatal(err)
		}
	}
}
