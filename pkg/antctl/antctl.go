// Package antctl is the code of the antctl binary: the command-line client
// that reports its own version and a server's.
package antctl

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/kiln-build/kiln/pkg/version"
)

// Name is the binary's name.
const Name = "antctl"

const usage = `usage: antctl version [--server URL]

Commands:
  version   print antctl's version, and the server's with --server
`

// Main runs antctl with the given arguments and returns its exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	switch args[0] {
	case "version", "--version":
		return versionCmd(args[1:], stdout, stderr)
	default:
		fmt.Fprintf(stderr, "antctl: unknown command %q\n%s", args[0], usage)
		return 2
	}
}

func versionCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("antctl version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	server := fs.String("server", "", "base URL of an antrea-agent or antrea-controller, e.g. http://127.0.0.1:10349")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fmt.Fprintln(stdout, version.Get(Name))
	if *server == "" {
		return 0
	}
	info, err := serverVersion(*server)
	if err != nil {
		fmt.Fprintf(stderr, "antctl: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, info)
	return 0
}

func serverVersion(base string) (version.Info, error) {
	var info version.Info
	url := strings.TrimSuffix(base, "/") + "/version"
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return info, fmt.Errorf("get server version: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return info, fmt.Errorf("get %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		return info, fmt.Errorf("decode %s: %w", url, err)
	}
	return info, nil
}
