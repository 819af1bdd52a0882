//go:build ignore

// Zero-install entry point: `go run mage.go <target>` works without a mage
// binary on PATH. It runs mage from magefiles/, whose go.mod holds kiln and
// its BuildKit and containerd graph, so the product's go.mod never lists
// them; the targets still run in this directory. (Run from the root, mage
// would resolve the magefile's imports against the root go.mod.)
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// startedEnv names a file the targets remove when they start (targets'
// init): until then mage is compiling them, silently, for a minute on a
// fresh machine, so this process says so.
const startedEnv = "KILN_MAGE_STARTED"

// goflagsEnv carries the user's GOFLAGS past mage: mage lists each
// //mage:import package twice with go list, which loads BuildKit's and
// containerd's whole import graph every time (0.1 s a call, most of a
// no-op's time), so mage runs with -find added, which names a package and
// its files, all mage reads (0.03 s). go applies a GOFLAGS flag only to
// the commands that know it, so no go build sees it; the targets put the
// user's GOFLAGS back as they start. "unset" or "=" and the value.
const goflagsEnv = "KILN_MAGE_GOFLAGS"

func main() {
	args := append([]string{"tool", "-C", "magefiles", "mage", "-d", ".", "-w", ".."}, os.Args[1:]...)
	cmd := exec.Command("go", args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = os.Environ()
	done := make(chan struct{})
	var marker string
	if f, err := os.CreateTemp("", "kiln-mage-"); err == nil {
		f.Close()
		marker = f.Name()
		cmd.Env = append(cmd.Env, startedEnv+"="+marker)
		go sayCompiling(marker, done)
	}
	goflags, set := os.LookupEnv("GOFLAGS")
	saved := "unset"
	if set {
		saved = "=" + goflags
	}
	cmd.Env = append(cmd.Env, goflagsEnv+"="+saved, "GOFLAGS="+strings.TrimSpace(goflags+" -find"))
	// Ctrl-C reaches mage through the terminal's process group; mage
	// decides the exit code, this process only waits for it.
	signal.Ignore(os.Interrupt, syscall.SIGTERM)
	err := cmd.Run()
	close(done)
	if marker != "" {
		os.Remove(marker) // still there when mage failed before the targets ran
	}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		os.Exit(exit.ExitCode())
	case err != nil:
		fmt.Fprintln(os.Stderr, "mage.go:", err)
		os.Exit(1)
	}
}

// sayCompiling prints a line once the targets have not started for 3 s,
// then one every 20 s, until they start or mage ends.
func sayCompiling(marker string, done <-chan struct{}) {
	start := time.Now()
	next := 3 * time.Second
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		if _, err := os.Stat(marker); err != nil {
			return
		}
		if waited := time.Since(start); waited >= next {
			if next == 3*time.Second {
				fmt.Fprintln(os.Stderr, "kiln: compiling the mage targets (after kiln or the magefile changed; about a minute on a fresh machine)")
			} else {
				fmt.Fprintf(os.Stderr, "kiln: still compiling the mage targets (%s)\n", waited.Round(time.Second))
			}
			next += 20 * time.Second
		}
	}
}
