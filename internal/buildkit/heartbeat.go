package buildkit

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containerd/console"
	"github.com/moby/buildkit/client"
	"github.com/opencontainers/go-digest"
)

// heartbeatAfter is how long the plain display may stay silent while a step
// runs: BuildKit's plain display prints only what a step writes, and a cold
// go build writes nothing for a minute or more.
const heartbeatAfter = 20 * time.Second

// heartbeat says which steps are still running when the plain display has
// printed nothing for heartbeatAfter. The tty display shows running steps
// with their timers itself, and quiet and rawjson must print nothing else.
type heartbeat struct {
	out io.Writer

	mu      sync.Mutex
	running map[digest.Digest]runningStep
	// quietSince is when the display last had something to print.
	quietSince time.Time
}

type runningStep struct {
	name    string
	started time.Time
}

// plainDisplay says whether progressui shows mode on out as plain lines.
func plainDisplay(out io.Writer, mode string) bool {
	switch mode {
	case "plain":
		return true
	case "auto", "", "default":
		f, ok := out.(console.File)
		if !ok {
			return true
		}
		_, err := console.ConsoleFromFile(f)
		return err != nil
	}
	return false
}

func newHeartbeat(out io.Writer, now time.Time) *heartbeat {
	return &heartbeat{out: out, running: map[digest.Digest]runningStep{}, quietSince: now}
}

// saw records a status the display is about to print.
func (h *heartbeat) saw(s *client.SolveStatus, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(s.Logs) > 0 || len(s.Warnings) > 0 {
		h.quietSince = now
	}
	for _, v := range s.Vertexes {
		_, known := h.running[v.Digest]
		switch {
		case v.Completed != nil || v.Error != "" || v.Cached:
			delete(h.running, v.Digest)
			h.quietSince = now
		case v.Started != nil && !known:
			// The client's clock: a remote daemon's may be off.
			h.running[v.Digest] = runningStep{name: v.Name, started: now}
			h.quietSince = now
		}
	}
}

// check prints one line naming the running steps once the display has been
// quiet for heartbeatAfter, and then again every heartbeatAfter.
func (h *heartbeat) check(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.running) == 0 || now.Sub(h.quietSince) < heartbeatAfter {
		return
	}
	steps := make([]runningStep, 0, len(h.running))
	for _, st := range h.running {
		steps = append(steps, st)
	}
	sort.Slice(steps, func(i, j int) bool {
		if !steps[i].started.Equal(steps[j].started) {
			return steps[i].started.Before(steps[j].started)
		}
		return steps[i].name < steps[j].name
	})
	parts := make([]string, len(steps))
	for i, st := range steps {
		parts[i] = fmt.Sprintf("%s (%s)", st.name, now.Sub(st.started).Round(time.Second))
	}
	fmt.Fprintf(h.out, "kiln: still running %s\n", strings.Join(parts, ", "))
	h.quietSince = now
}

// run checks every second until stop is closed.
func (h *heartbeat) run(stop <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			h.check(now)
		}
	}
}
