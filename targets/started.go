package targets

import "os"

// The zero-install entry point (mage.go) says that mage is compiling until
// the targets start; removing its marker file tells it they have.
func init() {
	if marker := os.Getenv("KILN_MAGE_STARTED"); marker != "" {
		os.Remove(marker)
		os.Unsetenv("KILN_MAGE_STARTED")
	}
}
