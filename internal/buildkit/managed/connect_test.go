package managed

import (
	"context"
	"strings"
	"testing"
)

// TestConnectToAList: a list of daemons is for images alone, an empty one
// is an error, and a trailing comma leaves one daemon.
func TestConnectToAList(t *testing.T) {
	ctx := context.Background()
	if _, err := ConnectTo(ctx, t.TempDir(), "unix:///a.sock,unix:///b.sock"); err == nil || !strings.Contains(err.Error(), "names 2 daemons") {
		t.Errorf("two daemons: %v", err)
	}
	if _, err := ConnectTo(ctx, t.TempDir(), " , "); err == nil || !strings.Contains(err.Error(), "names no daemon") {
		t.Errorf("no daemon: %v", err)
	}
	// One daemon, not there: the error names it without the comma.
	_, err := ConnectTo(ctx, t.TempDir(), "unix:///nonexistent/kiln-test.sock,")
	if err == nil || !strings.Contains(err.Error(), "unix:///nonexistent/kiln-test.sock") || strings.Contains(err.Error(), "sock,") {
		t.Errorf("one daemon and a trailing comma: %v", err)
	}
}
