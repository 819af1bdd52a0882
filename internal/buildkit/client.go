// Package buildkit owns kiln's side of the BuildKit client: dialing a
// daemon (BUILDKIT_HOST's address, TLS, plain-text refusals), solving jobs
// with progress and a heartbeat, exporting OCI tarballs without partial
// files (a tarball in place stands for the export only when intact),
// layer caches and registry credentials, and kiln's cache folder. Package
// managed starts the local daemon; package export writes the files a solve
// made into a folder.
package buildkit

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/moby/buildkit/client"
	// Connection helpers for BUILDKIT_HOST=docker-container://, kube-pod:// and ssh://.
	_ "github.com/moby/buildkit/client/connhelper/dockercontainer"
	_ "github.com/moby/buildkit/client/connhelper/kubepod"
	_ "github.com/moby/buildkit/client/connhelper/ssh"
)

// HostEnv is the ecosystem's variable naming a BuildKit daemon.
const HostEnv = "BUILDKIT_HOST"

// Hosts are the daemons an address list names, in order: BUILDKIT_HOST
// may name several, comma-separated, for a build spread over them (no
// daemon address holds a comma).
func Hosts(list string) []string {
	var hosts []string
	for _, h := range strings.Split(list, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hosts = append(hosts, h)
		}
	}
	return hosts
}

// Local is a daemon kiln started on this machine (package managed).
type Local interface {
	// PID is the daemon's process id, false when it has none.
	PID() (int, bool)
	// LogFile is the daemon's log.
	LogFile() string
}

// Daemon is a connected BuildKit daemon.
type Daemon struct {
	*client.Client
	Address string
	// Managed is set when kiln started (or reuses) the local daemon.
	Managed Local
}

// PlaintextEnv allows a tcp:// daemon off this machine without TLS.
const PlaintextEnv = "KILN_ALLOW_PLAINTEXT_TCP"

// plaintextAllowed refuses a plain tcp:// daemon beyond loopback: kiln sends
// it the sources, the netrc and git secrets, the SSH agent and registry
// tokens, all readable on the wire.
func plaintextAllowed(addr string, withTLS bool) error {
	hostport, ok := strings.CutPrefix(addr, "tcp://")
	if !ok || withTLS || os.Getenv(PlaintextEnv) == "1" {
		return nil
	}
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return fmt.Errorf("%s=%s: a tcp:// daemon off this machine needs TLS, since kiln sends it sources and credentials: set %s (or %s, %s and %s); %s=1 allows plain text", HostEnv, addr, TLSDirEnv, TLSCACertEnv, TLSCertEnv, TLSKeyEnv, PlaintextEnv)
}

// Mutual TLS for tcp:// daemons, named after buildctl's --tlscacert,
// --tlscert, --tlskey, --tlsservername and --tlsdir.
const (
	TLSCACertEnv     = "BUILDKIT_TLS_CA_CERT"
	TLSCertEnv       = "BUILDKIT_TLS_CERT"
	TLSKeyEnv        = "BUILDKIT_TLS_KEY"
	TLSServerNameEnv = "BUILDKIT_TLS_SERVERNAME"
	TLSDirEnv        = "BUILDKIT_TLS_DIR"
)

// tlsFiles are the TLS settings read from the environment.
type tlsFiles struct{ ca, cert, key, name string }

// tlsOptions reads the TLS environment; nil when none of it is set.
func tlsOptions(addr string) ([]client.ClientOpt, *tlsFiles, error) {
	ca, cert, key := os.Getenv(TLSCACertEnv), os.Getenv(TLSCertEnv), os.Getenv(TLSKeyEnv)
	if dir := os.Getenv(TLSDirEnv); dir != "" {
		if ca != "" || cert != "" || key != "" {
			return nil, nil, fmt.Errorf("%s and %s/%s/%s are both set; use one or the other", TLSDirEnv, TLSCACertEnv, TLSCertEnv, TLSKeyEnv)
		}
		// buildctl's names, then the ones of a Kubernetes TLS secret.
		pick := func(names ...string) string {
			for _, n := range names {
				if _, err := os.Stat(filepath.Join(dir, n)); err == nil {
					return filepath.Join(dir, n)
				}
			}
			return filepath.Join(dir, names[0])
		}
		ca, cert, key = pick("ca.pem", "ca.crt"), pick("cert.pem", "tls.crt"), pick("key.pem", "tls.key")
	}
	name := os.Getenv(TLSServerNameEnv)
	if ca == "" && cert == "" && key == "" && name == "" {
		return nil, nil, nil
	}
	if !strings.HasPrefix(addr, "tcp://") {
		return nil, nil, fmt.Errorf("%s=%s: the BUILDKIT_TLS_* settings apply to tcp:// addresses only; unset them", HostEnv, addr)
	}
	if (cert == "") != (key == "") {
		return nil, nil, fmt.Errorf("mutual TLS needs both %s and %s (a client certificate and its key)", TLSCertEnv, TLSKeyEnv)
	}
	for env, path := range map[string]string{TLSCACertEnv: ca, TLSCertEnv: cert, TLSKeyEnv: key} {
		if path == "" {
			continue
		}
		if _, err := os.Stat(path); err != nil {
			return nil, nil, fmt.Errorf("%s: %s cannot be read (%v); point it at the PEM file", env, path, err)
		}
	}
	var opts []client.ClientOpt
	if ca != "" {
		opts = append(opts, client.WithServerConfig(name, ca))
	} else {
		opts = append(opts, client.WithServerConfigSystem(name))
	}
	if cert != "" {
		opts = append(opts, client.WithCredentials(cert, key))
	}
	return opts, &tlsFiles{ca: ca, cert: cert, key: key, name: name}, nil
}

// probeTLS repeats the handshake alone to learn why the daemon refused it:
// with TLS 1.3 the server rejects a client certificate after the client has
// finished, so the gRPC call often sees only a reset connection.
func probeTLS(addr string, f *tlsFiles) string {
	cfg := &tls.Config{ServerName: f.name}
	if f.ca != "" {
		pem, err := os.ReadFile(f.ca)
		if err != nil {
			return err.Error()
		}
		cfg.RootCAs = x509.NewCertPool()
		cfg.RootCAs.AppendCertsFromPEM(pem)
	}
	if f.cert != "" {
		pair, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return err.Error()
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	host := strings.TrimPrefix(addr, "tcp://")
	if cfg.ServerName == "" {
		cfg.ServerName, _, _ = net.SplitHostPort(host)
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", host, cfg)
	if err != nil {
		return err.Error()
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err != nil {
		var netErr net.Error
		if errors.As(err, &netErr) && netErr.Timeout() {
			return "" // accepted: the daemon waits for the client to speak
		}
		return err.Error()
	}
	return ""
}

// daemonSchemes are the addresses kiln dials: a socket, TCP (TLS beyond
// loopback), and BuildKit's connection helpers it carries.
var daemonSchemes = []string{"unix", "tcp", "docker-container", "kube-pod", "ssh"}

// daemonAddress checks a daemon address and writes its scheme in lower
// case, as the checks below and BuildKit's dialer compare it: TCP://host
// or a gRPC target such as dns:///host:port would otherwise be dialed in
// plain text past the TLS check.
func daemonAddress(addr string) (string, error) {
	scheme, rest, ok := strings.Cut(addr, "://")
	if !ok || scheme == "" {
		return "", fmt.Errorf("%s=%s: give the scheme, one of %s:// (tcp://HOST:PORT for a remote daemon, with TLS)", HostEnv, addr, strings.Join(daemonSchemes, "://, "))
	}
	scheme = strings.ToLower(scheme)
	if !slices.Contains(daemonSchemes, scheme) {
		return "", fmt.Errorf("%s=%s: kiln does not dial %s:// daemons; use one of %s://", HostEnv, addr, scheme, strings.Join(daemonSchemes, "://, "))
	}
	return scheme + "://" + rest, nil
}

// Dial connects to a daemon at addr and checks that it answers.
func Dial(ctx context.Context, addr string) (*client.Client, error) {
	addr, err := daemonAddress(addr)
	if err != nil {
		return nil, err
	}
	tlsOpts, files, err := tlsOptions(addr)
	if err != nil {
		return nil, err
	}
	if err := plaintextAllowed(addr, tlsOpts != nil); err != nil {
		return nil, err
	}
	if err := probe(addr); err != nil {
		return nil, fmt.Errorf("BuildKit at %q is unreachable: %w; start buildkitd there or fix %s, or unset it to let kiln start a local daemon", addr, err, HostEnv)
	}
	c, err := client.New(ctx, addr, tlsOpts...)
	if err != nil {
		return nil, fmt.Errorf("connect to BuildKit at %q: %w; check %s and the BUILDKIT_TLS_* settings, or unset it to let kiln start a local daemon", addr, err, HostEnv)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if _, err := c.ListWorkers(pingCtx); err != nil {
		c.Close()
		reason := ""
		if files != nil {
			reason = probeTLS(addr, files)
		}
		if msg := err.Error(); reason == "" && (strings.Contains(msg, "tls:") || strings.Contains(msg, "x509") || strings.Contains(msg, "handshake")) {
			reason = tlsReason(msg)
		}
		if reason != "" {
			return nil, fmt.Errorf("BuildKit at %q refused the TLS connection: %s; check that %s is the CA that signed the daemon's certificate and that %s/%s are a client certificate the daemon's --tlscacert signed (or %s holds all three)",
				addr, reason, TLSCACertEnv, TLSCertEnv, TLSKeyEnv, TLSDirEnv)
		}
		if msg := err.Error(); tlsOpts == nil && (strings.Contains(msg, "server preface") || strings.Contains(msg, "connection reset")) {
			return nil, fmt.Errorf("BuildKit at %q closed a plain connection (%s): if the daemon uses TLS, set %s (or %s, %s and %s)",
				addr, tlsReason(msg), TLSDirEnv, TLSCACertEnv, TLSCertEnv, TLSKeyEnv)
		}
		return nil, fmt.Errorf("BuildKit at %q does not answer: %w; check that buildkitd runs there and %s is right, or unset it to let kiln start a local daemon", addr, err, HostEnv)
	}
	return c, nil
}

// tlsReason is the last clause of a gRPC transport error, the TLS cause.
func tlsReason(msg string) string {
	if i := strings.LastIndex(msg, "desc = "); i >= 0 {
		msg = msg[i+len("desc = "):]
	}
	return strings.Trim(msg, `"`)
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
