package cycle

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// countingQuota answers like limitQuota, counting the questions; byNumbers
// is what it says of its answers, and fail makes every answer an error.
type countingQuota struct {
	byNumbers bool
	fail      bool
	asked     int
}

func (q *countingQuota) CheckQuota(ctx context.Context, r *QuotaRequest) (*QuotaVerdict, error) {
	q.asked++
	if q.fail {
		return nil, errors.New("policy timed out")
	}
	return limitQuota{}.CheckQuota(ctx, r)
}

func (q *countingQuota) QuotaByNumbers() bool { return q.byNumbers }

func TestQuotaAnswersSharedWithinACycle(t *testing.T) {
	noLimit := ResourceUsage{Quota: -1, Limit: -1}
	full := QueueUsage{Name: "a", QuotaMilli: 1000, LimitMilli: 2000, AllocatedMilli: 2000, CPU: noLimit, Memory: noLimit}
	question := func(name string, q QueueUsage) *QuotaRequest {
		return &QuotaRequest{Workload: &Workload{Key: WorkloadKey{Namespace: "ns", PodGroup: name}, Queue: "a"}, Members: 2, GPUMilli: 2000, Queue: q}
	}
	cases := map[string]struct {
		checker   countingQuota
		questions []*QuotaRequest
		wantAsked int
		want      []string
	}{
		"two gangs asking the same are answered once": {
			checker:   countingQuota{byNumbers: true},
			questions: []*QuotaRequest{question("one", full), question("two", full)},
			wantAsked: 1,
			want:      []string{"denied: queue a is at its limit: 2 of 2 GPUs", "denied: queue a is at its limit: 2 of 2 GPUs"},
		},
		"a policy that reads who asks is asked each time": {
			checker:   countingQuota{},
			questions: []*QuotaRequest{question("one", full), question("two", full)},
			wantAsked: 2,
			want:      []string{"denied: queue a is at its limit: 2 of 2 GPUs", "denied: queue a is at its limit: 2 of 2 GPUs"},
		},
		"usage that changed is a new question": {
			checker:   countingQuota{byNumbers: true},
			questions: []*QuotaRequest{question("one", full), question("two", QueueUsage{Name: "a", QuotaMilli: 1000, LimitMilli: 2000, CPU: noLimit, Memory: noLimit})},
			wantAsked: 2,
			want:      []string{"denied: queue a is at its limit: 2 of 2 GPUs", "allowed"},
		},
		"a failure is not remembered": {
			checker:   countingQuota{byNumbers: true, fail: true},
			questions: []*QuotaRequest{question("one", full), question("two", full)},
			wantAsked: 2,
			want:      []string{"error: policy timed out", "error: policy timed out"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			checker := tc.checker
			quota := memoized(&checker)
			var got []string
			for _, r := range tc.questions {
				v, err := quota.CheckQuota(t.Context(), r)
				switch {
				case err != nil:
					got = append(got, "error: "+err.Error())
				case v.Allowed:
					got = append(got, "allowed")
				default:
					got = append(got, "denied: "+v.Reasons[0])
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("answers (-want +got):\n%s", diff)
			}
			if checker.asked != tc.wantAsked {
				t.Errorf("the policy was asked %d times, want %d", checker.asked, tc.wantAsked)
			}
		})
	}
}
