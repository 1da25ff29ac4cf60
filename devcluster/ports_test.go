package devcluster

import "testing"

// TestFreePortAvoidsEphemeralAndTakenPorts: the ports chosen lie below the
// kernel's ephemeral range (an outgoing connection cannot take them before
// their process binds them) and never repeat within a cluster.
func TestFreePortAvoidsEphemeralAndTakenPorts(t *testing.T) {
	high := ephemeralPortsStart()
	taken := map[int]bool{}
	for range 50 {
		p, err := freePort(taken)
		if err != nil {
			t.Fatal(err)
		}
		if taken[p] {
			t.Fatalf("port %d chosen twice", p)
		}
		if high > 11000 && (p < 10000 || p >= high) {
			t.Errorf("port %d is outside [10000, %d), the ports below the ephemeral range", p, high)
		}
		taken[p] = true
	}
}
