package targets

import (
	"os"
	"strings"

	"github.com/kiln-build/kiln/targets/internal/magerun"
)

func init() { restoreMageEnv() }

// restoreMageEnv undoes what kiln-mage (the entry behind `go run mage.go`)
// set for mage alone, before any go command or the no-op check reads the
// environment: it removes the marker file whose presence says that mage is
// still compiling the targets, puts back the user's GOFLAGS, which it gave
// mage with -find added, set or unset as they were, and records that this
// binary is the one built from the inputs kiln-mage fingerprinted, so that
// its next run can start it without mage.
func restoreMageEnv() {
	if marker := os.Getenv(magerun.StartedEnv); marker != "" {
		os.Remove(marker)
		os.Unsetenv(magerun.StartedEnv)
	}
	if saved, ok := os.LookupEnv(magerun.GoflagsEnv); ok {
		if goflags, set := strings.CutPrefix(saved, "="); set {
			os.Setenv("GOFLAGS", goflags)
		} else {
			os.Unsetenv("GOFLAGS")
		}
		os.Unsetenv(magerun.GoflagsEnv)
	}
	stamp, fingerprint := os.Getenv(magerun.StampEnv), os.Getenv(magerun.FingerprintEnv)
	os.Unsetenv(magerun.StampEnv)
	os.Unsetenv(magerun.FingerprintEnv)
	if stamp != "" && fingerprint != "" {
		magerun.Write(stamp, fingerprint)
	}
}
