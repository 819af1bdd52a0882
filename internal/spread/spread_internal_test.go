package spread

import (
	"strings"
	"testing"

	"github.com/kiln-build/kiln/internal/plan"
	"github.com/kiln-build/kiln/internal/session"
)

// TestSpreadPartsMustReadTheSameTree: parts of a spread build that read a
// source file differently, or were stamped differently, are not merged.
func TestSpreadPartsMustReadTheSameTree(t *testing.T) {
	hosts := []string{"unix:///a.sock", "unix:///b.sock"}
	part := func(digest, commit string, extra ...string) *session.ImagesOutcome {
		sources := map[string]string{"pkg/agent/agent.go": digest}
		for _, f := range extra {
			sources[f] = "sha256:other"
		}
		return &session.ImagesOutcome{Sources: sources, Stamp: plan.Stamp{Version: "v1.0.0", Commit: commit, TreeState: "clean"}}
	}
	if err := sameSources(hosts, []*session.ImagesOutcome{part("sha256:a", "c1"), part("sha256:a", "c1", "pkg/agent/agent_arm64.go")}); err != nil {
		t.Errorf("parts of one tree (one reading a file the other does not): %v", err)
	}
	if err := sameSources(hosts, []*session.ImagesOutcome{part("sha256:a", "c1"), part("sha256:b", "c1")}); err == nil || !strings.Contains(err.Error(), "pkg/agent/agent.go") || !strings.Contains(err.Error(), hosts[1]) {
		t.Errorf("parts that read agent.go differently: %v", err)
	}
	if err := sameSources(hosts, []*session.ImagesOutcome{part("sha256:a", "c1"), part("sha256:a", "c2")}); err == nil || !strings.Contains(err.Error(), "stamped") {
		t.Errorf("parts stamped with two commits: %v", err)
	}
	if err := sameSources(hosts, []*session.ImagesOutcome{nil, part("sha256:a", "c1")}); err != nil {
		t.Errorf("a daemon with no platform: %v", err)
	}
}
