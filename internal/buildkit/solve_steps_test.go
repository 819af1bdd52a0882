package buildkit

import (
	"testing"
	"time"
)

// TestStepsPlus: a step two solves share ran in the jobs of either, and
// counts as reused only when both reused it.
func TestStepsPlus(t *testing.T) {
	first := Steps{{Name: "[go] toolchain", Runs: 1, Duration: time.Second}, {Name: "[a] go build", Runs: 1}, {Name: "[go] kilnstep", Cached: true}}
	later := Steps{{Name: "[a] go build", Cached: true}, {Name: "[go] kilnstep", Cached: true}, {Name: "[img] assemble", Runs: 1}, {Name: "[go] toolchain", Runs: 1, Duration: 2 * time.Second}}
	got := first.Plus(later)
	want := Steps{{Name: "[go] toolchain", Runs: 2, Duration: 2 * time.Second}, {Name: "[a] go build", Runs: 1}, {Name: "[go] kilnstep", Cached: true}, {Name: "[img] assemble", Runs: 1}}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("step %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if first[0].Runs != 1 {
		t.Error("Plus changed its receiver")
	}
}
