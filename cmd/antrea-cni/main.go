// Command antrea-cni is Antrea's CNI plugin, reduced to what kiln's builds
// exercise.
package main

import (
	"os"

	"github.com/kiln-build/kiln/pkg/cni"
)

func main() { os.Exit(cni.Main(os.Args[1:], os.Getenv, os.Stdout)) }
