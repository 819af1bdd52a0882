package bench

import (
	"slices"
	"testing"
)

// TestNeitherSideAlwaysRunsSecond: native and kiln take turns in both
// orders, round by round.
func TestNeitherSideAlwaysRunsSecond(t *testing.T) {
	for round, want := range map[int][]int{1: {0, 1, 2}, 2: {2, 1, 0}, 3: {0, 1, 2}, 4: {2, 1, 0}} {
		if got := roundOrder(3, round); !slices.Equal(got, want) {
			t.Errorf("round %d: order %v, want %v", round, got, want)
		}
	}
}
