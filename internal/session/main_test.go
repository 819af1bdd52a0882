package session_test

import (
	"os"
	"testing"

	"github.com/kiln-build/kiln/internal/testdaemon"
)

// TestMain stops the daemon the tests share.
func TestMain(m *testing.M) {
	code := m.Run()
	testdaemon.StopShared()
	os.Exit(code)
}
