package buildkit

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"time"

	"github.com/moby/buildkit/client"
	// Connection helpers for BUILDKIT_HOST=docker-container://, kube-pod:// and ssh://.
	_ "github.com/moby/buildkit/client/connhelper/dockercontainer"
	_ "github.com/moby/buildkit/client/connhelper/kubepod"
	_ "github.com/moby/buildkit/client/connhelper/ssh"
)

// HostEnv is the ecosystem's variable naming a BuildKit daemon.
const HostEnv = "BUILDKIT_HOST"

// Daemon is a connected BuildKit daemon.
type Daemon struct {
	*client.Client
	Address string
	// Managed is set when kiln started (or reuses) the local daemon.
	Managed *Managed
}

// Connect dials BUILDKIT_HOST when it is set, and otherwise the managed
// local daemon, starting it if needed.
func Connect(ctx context.Context, repoRoot string) (*Daemon, error) {
	if addr := os.Getenv(HostEnv); addr != "" {
		c, err := Dial(ctx, addr)
		if err != nil {
			return nil, err
		}
		return &Daemon{Client: c, Address: addr}, nil
	}
	m, err := DefaultManaged(repoRoot)
	if err != nil {
		return nil, err
	}
	c, err := m.Ensure(ctx)
	if err != nil {
		return nil, err
	}
	return &Daemon{Client: c, Address: m.Address(), Managed: m}, nil
}

// Dial connects to a daemon at addr and checks that it answers.
func Dial(ctx context.Context, addr string) (*client.Client, error) {
	if err := probe(addr); err != nil {
		return nil, fmt.Errorf("BuildKit at %q is unreachable: %w; start buildkitd there or fix %s, or unset it to let kiln start a local daemon", addr, err, HostEnv)
	}
	c, err := client.New(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("connect to BuildKit at %q: %w; check %s, or unset it to let kiln start a local daemon", addr, err, HostEnv)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if _, err := c.ListWorkers(pingCtx); err != nil {
		c.Close()
		return nil, fmt.Errorf("BuildKit at %q does not answer: %w; check that buildkitd runs there and %s is right, or unset it to let kiln start a local daemon", addr, err, HostEnv)
	}
	return c, nil
}

// probe fails fast for the address kinds that can be checked without
// gRPC, which otherwise retries until its deadline.
func probe(addr string) error {
	u, err := url.Parse(addr)
	if err != nil {
		return err
	}
	switch u.Scheme {
	case "unix":
		_, err := os.Stat(u.Path)
		return err
	case "tcp":
		conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
		if err != nil {
			return err
		}
		return conn.Close()
	}
	return nil
}
