package targets

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-build/kiln/targets/internal/magerun"
)

// TestTheTargetsSeeTheUsersGOFLAGS: kiln-mage hands mage GOFLAGS with -find
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
		t.Setenv(magerun.GoflagsEnv, c.saved)
		restoreMageEnv()
		got, set := os.LookupEnv("GOFLAGS")
		if got != c.want || set != c.set {
			t.Errorf("%s %q: GOFLAGS %q (set %v), want %q (set %v)", magerun.GoflagsEnv, c.saved, got, set, c.want, c.set)
		}
		if _, left := os.LookupEnv(magerun.GoflagsEnv); left {
			t.Errorf("%s %q was left for the build to see", magerun.GoflagsEnv, c.saved)
		}
	}
}

// TestTheTargetsRecordTheirStart: asked by kiln-mage, the targets record
// the running binary, and only one in the record's folder, mage's cache;
// the request is not left for what they start.
func TestTheTargetsRecordTheirStart(t *testing.T) {
	start := func(stamp string) {
		t.Setenv(magerun.StampEnv, stamp)
		t.Setenv(magerun.FingerprintEnv, "fingerprint")
		restoreMageEnv()
		for _, name := range []string{magerun.StampEnv, magerun.FingerprintEnv} {
			if _, left := os.LookupEnv(name); left {
				t.Errorf("%s was left for the build to see", name)
			}
		}
	}
	elsewhere := filepath.Join(t.TempDir(), "kiln-targets-test.json")
	start(elsewhere)
	if _, err := os.Stat(elsewhere); err == nil {
		t.Errorf("a record beside no targets binary was written: %s", elsewhere)
	}

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	stamp := filepath.Join(filepath.Dir(exe), "kiln-targets-test.json")
	t.Cleanup(func() { os.Remove(stamp) })
	start(stamp)
	data, err := os.ReadFile(stamp)
	if err != nil {
		t.Fatal(err)
	}
	var rec magerun.Record
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(exe)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Exe != exe || rec.Fingerprint != "fingerprint" || rec.File == "" || !rec.Matches(info) {
		t.Errorf("record %s, want the running binary %s", data, exe)
	}
}
