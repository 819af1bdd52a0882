package antctl

import (
	"bytes"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kiln-build/kiln/pkg/healthserver"
)

func TestVersionWithServer(t *testing.T) {
	srv := httptest.NewServer(healthserver.Handler("antrea-controller"))
	defer srv.Close()
	var out, errOut bytes.Buffer
	if code := Main([]string{"version", "--server", srv.URL}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "antctl version ") || !strings.HasPrefix(lines[1], "antrea-controller version ") {
		t.Errorf("unexpected output:\n%s", out.String())
	}
	if !strings.Contains(lines[0], "cgo=") {
		t.Errorf("version does not say whether cgo was on: %s", lines[0])
	}
}

func TestUnreachableServer(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := Main([]string{"version", "--server", "http://127.0.0.1:1"}, &out, &errOut); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if !strings.Contains(errOut.String(), "server version") {
		t.Errorf("error does not say what failed: %s", errOut.String())
	}
}

func TestUnknownCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := Main([]string{"frobnicate"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "unknown command") {
		t.Errorf("exit %d, stderr %q", code, errOut.String())
	}
}
