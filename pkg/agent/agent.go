// Package agent is the code of the antrea-agent binary: a daemon that serves its
// health and version over HTTP.
package agent

import (
	"embed"
	"flag"
	"fmt"
	"io"

	"github.com/kiln-build/kiln/pkg/healthserver"
	"github.com/kiln-build/kiln/pkg/version"
)

// Name is the binary's name.
const Name = "antrea-agent"

// defaults is a directory tree embedded the way Antrea embeds its default
// configuration: a //go:embed of a subdirectory.
//
//go:embed config
var defaults embed.FS

// DefaultConfig is the embedded default configuration.
func DefaultConfig() string {
	data, _ := defaults.ReadFile("config/defaults/antrea-agent.conf")
	return string(data)
}

// Main runs antrea-agent with the given arguments and returns its exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(Name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:10350", "address to serve /healthz and /version on")
	showVersion := fs.Bool("version", false, "print the version and exit")
	showConfig := fs.Bool("default-config", false, "print the embedded default configuration and exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *showConfig {
		fmt.Fprint(stdout, DefaultConfig())
		return 0
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
