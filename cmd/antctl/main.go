// Command antctl is Antrea's command-line client, reduced to what kiln's
// builds exercise.
package main

import (
	"os"

	"github.com/kiln-build/kiln/pkg/antctl"
)

func main() { os.Exit(antctl.Main(os.Args[1:], os.Stdout, os.Stderr)) }
