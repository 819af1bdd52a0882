package buildkit

import (
	"bytes"
	"os"
	"testing"
	"time"

	"github.com/moby/buildkit/client"
)

// A step that prints nothing for a minute is named every 20 s on the plain
// display, with how long it has run; nothing is said while steps print,
// once they are done, or when no step runs.
func TestPlainDisplayNamesStepsThatRunSilently(t *testing.T) {
	var out bytes.Buffer
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	h := newHeartbeat(&out, t0)

	h.check(at(25 * time.Second))
	if out.Len() != 0 {
		t.Fatalf("nothing runs, yet it said %q", out.String())
	}

	started := at(30 * time.Second)
	h.saw(&client.SolveStatus{Vertexes: []*client.Vertex{
		{Digest: "sha256:a", Name: "[linux/amd64] go build", Started: &started},
		{Digest: "sha256:b", Name: "[linux/arm64] go build", Started: &started},
	}}, started)
	h.check(at(45 * time.Second))
	if out.Len() != 0 {
		t.Fatalf("15 s after the steps started it said %q", out.String())
	}
	h.check(at(50 * time.Second))
	want := "kiln: still running [linux/amd64] go build (20s), [linux/arm64] go build (20s)\n"
	if out.String() != want {
		t.Fatalf("after 20 quiet seconds it said %q, want %q", out.String(), want)
	}

	// A step's own output is something the display prints.
	out.Reset()
	h.saw(&client.SolveStatus{Logs: []*client.VertexLog{{Vertex: "sha256:a", Data: []byte("compiling\n")}}}, at(55*time.Second))
	h.check(at(70 * time.Second))
	if out.Len() != 0 {
		t.Fatalf("15 s after a log line it said %q", out.String())
	}

	done := at(72 * time.Second)
	h.saw(&client.SolveStatus{Vertexes: []*client.Vertex{{Digest: "sha256:a", Name: "[linux/amd64] go build", Started: &started, Completed: &done}}}, done)
	h.check(at(95 * time.Second))
	if want := "kiln: still running [linux/arm64] go build (1m5s)\n"; out.String() != want {
		t.Fatalf("with one step left it said %q, want %q", out.String(), want)
	}

	out.Reset()
	h.saw(&client.SolveStatus{Vertexes: []*client.Vertex{{Digest: "sha256:b", Name: "[linux/arm64] go build", Started: &started, Completed: &done}}}, at(96*time.Second))
	h.check(at(200 * time.Second))
	if out.Len() != 0 {
		t.Fatalf("with every step done it said %q", out.String())
	}
}

// Only the plain display gets the line: a terminal shows running steps
// itself, and quiet and rawjson output must stay as they are.
func TestHeartbeatOnlyOnThePlainDisplay(t *testing.T) {
	var buf bytes.Buffer
	for mode, want := range map[string]bool{"plain": true, "auto": true, "tty": false, "quiet": false, "rawjson": false} {
		if got := plainDisplay(&buf, mode); got != want {
			t.Errorf("mode %s to a buffer: plain display %v, want %v", mode, got, want)
		}
	}
	f, err := os.CreateTemp(t.TempDir(), "progress")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !plainDisplay(f, "auto") {
		t.Error("auto to a file that is no terminal is the plain display")
	}
}
