// Command antrea-controller is Antrea's controller daemon, reduced to what kiln's builds exercise.
package main

import (
	"os"

	"github.com/kiln-build/kiln/pkg/controller"
)

func main() { os.Exit(controller.Main(os.Args[1:], os.Stdout, os.Stderr)) }
