package spread

import (
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/plan"
)

// TestSpreadPartsMustReadTheSameTree: parts of a spread build that read a
// source file differently, or were stamped differently, are not merged.
func TestSpreadPartsMustReadTheSameTree(t *testing.T) {
	hosts := []string{"unix:///a.sock", "unix:///b.sock"}
	parts := func(a, b Read) []Read {
		a.Host, b.Host = hosts[0], hosts[1]
		return []Read{a, b}
	}
	read := func(digest, commit string, extra ...string) Read {
		sources := map[string]string{"pkg/agent/agent.go": digest}
		for _, f := range extra {
			sources[f] = "sha256:other"
		}
		return Read{Sources: sources, Stamp: plan.Stamp{Version: "v1.0.0", Commit: commit, TreeState: "clean"}}
	}
	if err := SameTree(parts(read("sha256:a", "c1"), read("sha256:a", "c1", "pkg/agent/agent_arm64.go"))); err != nil {
		t.Errorf("parts of one tree (one reading a file the other does not): %v", err)
	}
	if err := SameTree(parts(read("sha256:a", "c1"), read("sha256:b", "c1"))); err == nil || !strings.Contains(err.Error(), "pkg/agent/agent.go") || !strings.Contains(err.Error(), hosts[1]) {
		t.Errorf("parts that read agent.go differently: %v", err)
	}
	if err := SameTree(parts(read("sha256:a", "c1"), read("sha256:a", "c2"))); err == nil || !strings.Contains(err.Error(), "stamped") {
		t.Errorf("parts stamped with two commits: %v", err)
	}
}

// TestDeal: platforms go round-robin, those a builder prefers to it first,
// and each daemon builds its share in the plan's order.
func TestDeal(t *testing.T) {
	platforms := []string{"linux/amd64", "linux/arm64", "linux/arm/v7"}
	a, b, c := "tcp://a:1234", "tcp://b:1234", "kube-pod://c"
	for _, tt := range []struct {
		name     string
		hosts    []string
		builders []config.Builder
		want     string
	}{
		{"round-robin", []string{a, b}, nil, "[[linux/amd64 linux/arm/v7] [linux/arm64]]"},
		{"more daemons than platforms", []string{a, b, c, "tcp://d:1234"}, nil, "[[linux/amd64] [linux/arm64] [linux/arm/v7] []]"},
		{"b prefers arm", []string{a, b}, []config.Builder{{Address: b, Platforms: []string{"linux/arm64", "linux/arm/v7"}}}, "[[linux/amd64] [linux/arm64 linux/arm/v7]]"},
		{"a preferred platform given first", []string{a, b}, []config.Builder{{Address: a, Platforms: []string{"linux/arm/v7"}}}, "[[linux/arm64 linux/arm/v7] [linux/amd64]]"},
		{"two prefer arm64, the less loaded takes it", []string{a, b, c}, []config.Builder{{Address: a, Platforms: []string{"linux/amd64", "linux/arm64"}}, {Address: c, Platforms: []string{"linux/arm64"}}}, "[[linux/amd64] [linux/arm/v7] [linux/arm64]]"},
		{"a builder not named in the list", []string{a, b}, []config.Builder{{Address: c, Platforms: []string{"linux/amd64"}}}, "[[linux/amd64 linux/arm/v7] [linux/arm64]]"},
		{"a preferred platform not built", []string{a, b}, []config.Builder{{Address: b, Platforms: []string{"linux/s390x"}}}, "[[linux/amd64 linux/arm/v7] [linux/arm64]]"},
	} {
		if got := fmt.Sprint(Deal(platforms, tt.hosts, tt.builders)); got != tt.want {
			t.Errorf("%s: dealt %s, want %s", tt.name, got, tt.want)
		}
	}
}

// TestDaemonLines: each daemon's progress reaches the one writer in whole
// lines, each led by its daemon's name, however the writes were cut; what
// is left of a line is written when the daemon's part ends.
func TestDaemonLines(t *testing.T) {
	var out strings.Builder
	hosts := []string{"tcp://buildkitd-0.buildkitd:1234", "unix:///run/buildkit/buildkitd.sock", "ssh://builder/run/a.sock", "ssh://builder/run/b.sock"}
	shared := &lockedWriter{w: &out, names: names(hosts)}
	a, b, c := shared.lines(hosts[0]), shared.lines(hosts[1]), shared.lines(hosts[2])
	for _, w := range []struct {
		to   io.Writer
		text string
	}{
		{a, "#1 [linux/amd64] go bu"}, {b, "#1 [linux/arm64] go build\n#2 DO"}, {a, "ild\n"}, {b, "NE 1.2s\n"}, {c, "#3 [linux/arm/v7] go bu"},
	} {
		if n, err := w.to.Write([]byte(w.text)); err != nil || n != len(w.text) {
			t.Fatalf("wrote %d of %q: %v", n, w.text, err)
		}
	}
	c.flush()
	// Two daemons on one ssh host keep their whole addresses.
	want := "[/run/buildkit/buildkitd.sock] #1 [linux/arm64] go build\n[buildkitd-0.buildkitd:1234] #1 [linux/amd64] go build\n[/run/buildkit/buildkitd.sock] #2 DONE 1.2s\n[ssh://builder/run/a.sock] #3 [linux/arm/v7] go bu\n"
	if out.String() != want {
		t.Errorf("the progress lines:\n%s\nwant:\n%s", out.String(), want)
	}
}
