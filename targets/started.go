package targets

import (
	"os"
	"strings"
)

func init() { restoreMageEnv() }

// restoreMageEnv undoes what the zero-install entry point (mage.go) set for
// mage alone, before any go command or the no-op check reads the
// environment: it removes the marker file whose presence says that mage is
// still compiling the targets, and puts back the user's GOFLAGS, which it
// gave mage with -find added (see mage.go), set or unset as they were.
func restoreMageEnv() {
	if marker := os.Getenv("KILN_MAGE_STARTED"); marker != "" {
		os.Remove(marker)
		os.Unsetenv("KILN_MAGE_STARTED")
	}
	if saved, ok := os.LookupEnv("KILN_MAGE_GOFLAGS"); ok {
		if goflags, set := strings.CutPrefix(saved, "="); set {
			os.Setenv("GOFLAGS", goflags)
		} else {
			os.Unsetenv("GOFLAGS")
		}
		os.Unsetenv("KILN_MAGE_GOFLAGS")
	}
}
