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
	"syscall"
)

func main() {
	args := append([]string{"tool", "-C", "magefiles", "mage", "-d", ".", "-w", ".."}, os.Args[1:]...)
	cmd := exec.Command("go", args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// Ctrl-C reaches mage through the terminal's process group; mage
	// decides the exit code, this process only waits for it.
	signal.Ignore(os.Interrupt, syscall.SIGTERM)
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		os.Exit(exit.ExitCode())
	case err != nil:
		fmt.Fprintln(os.Stderr, "mage.go:", err)
		os.Exit(1)
	}
}
