package targets

import (
	"os"
	"testing"
)

// TestTheTargetsSeeTheUsersGOFLAGS: mage.go hands mage GOFLAGS with -find
// added, which breaks every go list -deps kiln runs; the targets see the
// user's own again, set, empty or unset as it was.
func TestTheTargetsSeeTheUsersGOFLAGS(t *testing.T) {
	for _, c := range []struct {
		saved, want string
		set         bool
	}{
		{"='-gcflags=all=-N -l' -mod=mod", "'-gcflags=all=-N -l' -mod=mod", true},
		{"=", "", true},
		{"unset", "", false},
	} {
		t.Setenv("GOFLAGS", c.want+" -find")
		t.Setenv("KILN_MAGE_GOFLAGS", c.saved)
		restoreMageEnv()
		got, set := os.LookupEnv("GOFLAGS")
		if got != c.want || set != c.set {
			t.Errorf("KILN_MAGE_GOFLAGS %q: GOFLAGS %q (set %v), want %q (set %v)", c.saved, got, set, c.want, c.set)
		}
		if _, left := os.LookupEnv("KILN_MAGE_GOFLAGS"); left {
			t.Errorf("KILN_MAGE_GOFLAGS %q was left for the build to see", c.saved)
		}
	}
}
