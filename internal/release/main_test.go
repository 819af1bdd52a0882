package release_test

import (
	"testing"

	"github.com/kiln-build/kiln/internal/testdaemon"
)

// TestMain stops the daemon the tests share.
func TestMain(m *testing.M) { testdaemon.Main(m) }
