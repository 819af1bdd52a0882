// Command antrea-agent is Antrea's agent daemon, reduced to what kiln's builds exercise.
package main

import (
	"os"

	"github.com/kiln-build/kiln/pkg/agent"
)

func main() { os.Exit(agent.Main(os.Args[1:], os.Stdout, os.Stderr)) }
