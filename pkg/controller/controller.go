// Package controller is the code of the antrea-controller binary: a daemon that serves its
// health and version over HTTP.
package controller

import (
	"flag"
	"fmt"
	"io"

	"github.com/kiln-build/kiln/pkg/healthserver"
	"github.com/kiln-build/kiln/pkg/version"
)

// Name is the binary's name.
const Name = "antrea-controller"

// Main runs antrea-controller with the given arguments and returns its exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(Name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:10349", "address to serve /healthz and /version on")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stdout, version.Get(Name))
		return 0
	}
	if err := healthserver.Run(Name, *addr); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", Name, err)
		return 1
	}
	return 0
}
