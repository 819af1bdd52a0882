//go:build ignore

// `go run mage.go ARGS` runs kiln's targets: kiln-mage, a tool of magefiles/go.mod.
package main

import (
	"os"
	"os/exec"
	"syscall"
)

func main() {
	goBin, err := exec.LookPath("go") // go run puts its own go first on PATH
	if err == nil {
		err = syscall.Exec(goBin, append([]string{"go", "tool", "-C", "magefiles", "kiln-mage"}, os.Args[1:]...), os.Environ())
	}
	os.Stderr.WriteString("mage.go: run kiln's targets: " + err.Error() + "\n")
	os.Exit(1)
}
