package testutil

import "testing"

func TestFreePortsAreDistinct(t *testing.T) {
	for round := 0; round < 200; round++ {
		ps := FreePorts(t, 4)
		seen := map[int]bool{}
		for _, p := range ps {
			if p <= 0 || p > 65535 {
				t.Fatalf("round %d: port %d out of range", round, p)
			}
			if seen[p] {
				t.Fatalf("round %d: port %d handed out twice in one call: %v", round, p, ps)
			}
			seen[p] = true
		}
	}
}
