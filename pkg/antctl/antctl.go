// Package antctl is the code of the antctl binary: the command-line client
// that reports its own version and a server's.
package antctl

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kiln-build/kiln/pkg/version"
)

// Name is the binary's name.
const Name = "antctl"

// errUsage marks a command line antctl does not understand (exit 2).
var errUsage = errors.New("usage")

// newCommand is antctl's command tree, as Antrea builds its own with cobra.
func newCommand(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           Name,
		Short:         "antctl talks to Antrea's agent and controller",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cmd.Usage()
			return errUsage
		},
	}
	var server string
	versionCmd := &cobra.Command{
		Use:   "version",
		Short: "print antctl's version, and the server's with --server",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			fmt.Fprintln(stdout, version.Get(Name))
			if server == "" {
				return nil
			}
			info, err := serverVersion(server)
			if err != nil {
				return err
			}
			fmt.Fprintln(stdout, info)
			return nil
		},
	}
	versionCmd.Flags().StringVar(&server, "server", "", "base URL of an antrea-agent or antrea-controller, e.g. http://127.0.0.1:10349")
	root.AddCommand(versionCmd)
	root.SetOut(stderr)
	root.SetErr(stderr)
	return root
}

// Main runs antctl with the given arguments and returns its exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "--version" {
		args = append([]string{"version"}, args[1:]...)
	}
	root := newCommand(stdout, stderr)
	root.SetArgs(args)
	err := root.Execute()
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage):
		return 2
	case strings.HasPrefix(err.Error(), "unknown command"), strings.HasPrefix(err.Error(), "unknown flag"):
		fmt.Fprintf(stderr, "antctl: %v\n", err)
		root.Usage()
		return 2
	}
	fmt.Fprintf(stderr, "antctl: %v\n", err)
	return 1
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
