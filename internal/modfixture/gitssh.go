package modfixture

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
)

// GitServer serves the bare repositories under Dir over SSH on 127.0.0.1
// (git-upload-pack only), to clients holding the key in Agent.
type GitServer struct {
	Dir     string
	Addr    string
	HostKey ssh.PublicKey
	// AgentSocket is an SSH agent holding the only accepted client key; the
	// key exists nowhere else.
	AgentSocket string
}

// StartGitServer starts the server and the agent for the test's lifetime.
func StartGitServer(t testing.TB) *GitServer {
	t.Helper()
	_, hostPriv, _ := ed25519.GenerateKey(rand.Reader)
	hostSigner, err := ssh.NewSignerFromKey(hostPriv)
	if err != nil {
		t.Fatal(err)
	}
	_, clientPriv, _ := ed25519.GenerateKey(rand.Reader)
	clientSigner, err := ssh.NewSignerFromKey(clientPriv)
	if err != nil {
		t.Fatal(err)
	}
	authorized := clientSigner.PublicKey().Marshal()
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
		if bytes.Equal(key.Marshal(), authorized) {
			return nil, nil
		}
		return nil, errors.New("unknown key")
	}}
	cfg.AddHostKey(hostSigner)

	s := &GitServer{Dir: t.TempDir(), HostKey: hostSigner.PublicKey()}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Addr = ln.Addr().String()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go s.serve(c, cfg)
		}
	}()

	keyring := agent.NewKeyring()
	if err := keyring.Add(agent.AddedKey{PrivateKey: clientPriv}); err != nil {
		t.Fatal(err)
	}
	sockDir, err := os.MkdirTemp("", "kiln-agent-") // short: socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	s.AgentSocket = filepath.Join(sockDir, "agent.sock")
	al, err := net.Listen("unix", s.AgentSocket)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := al.Accept()
			if err != nil {
				return
			}
			go func() { agent.ServeAgent(keyring, c); c.Close() }()
		}
	}()
	t.Cleanup(func() { ln.Close(); al.Close(); os.RemoveAll(sockDir) })
	return s
}

func (s *GitServer) serve(c net.Conn, cfg *ssh.ServerConfig) {
	defer c.Close()
	_, chans, reqs, err := ssh.NewServerConn(c, cfg)
	if err != nil {
		return
	}
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() != "session" {
			nc.Reject(ssh.UnknownChannelType, "sessions only")
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			return
		}
		go s.session(ch, creqs)
	}
}

func (s *GitServer) session(ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer ch.Close()
	for req := range reqs {
		switch req.Type {
		case "env":
			req.Reply(true, nil)
		case "exec":
			var p struct{ Command string }
			if err := ssh.Unmarshal(req.Payload, &p); err != nil {
				req.Reply(false, nil)
				return
			}
			prog, arg, _ := strings.Cut(p.Command, " ")
			if prog != "git-upload-pack" {
				req.Reply(false, nil)
				return
			}
			repo := filepath.Join(s.Dir, filepath.Clean("/"+strings.Trim(arg, "'")))
			if _, err := os.Stat(repo); err != nil {
				repo += ".git"
			}
			req.Reply(true, nil)
			cmd := exec.Command("git-upload-pack", repo)
			cmd.Stdin, cmd.Stdout, cmd.Stderr = ch, ch, ch.Stderr()
			code := uint32(0)
			if err := cmd.Run(); err != nil {
				code = 1
			}
			ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Code uint32 }{code}))
			return
		default:
			req.Reply(false, nil)
		}
	}
}

// Repo creates a bare repository name (e.g. private/greet.git) holding files
// in one commit tagged tag.
func (s *GitServer) Repo(t testing.TB, name, tag string, files map[string]string) {
	t.Helper()
	work := t.TempDir()
	Write(t, work, files)
	env := []string{"GIT_AUTHOR_NAME=kiln", "GIT_AUTHOR_EMAIL=kiln@example.invalid", "GIT_COMMITTER_NAME=kiln", "GIT_COMMITTER_EMAIL=kiln@example.invalid",
		"GIT_AUTHOR_DATE=2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE=2026-01-01T00:00:00Z", "GIT_CONFIG_GLOBAL=/dev/null"}
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"add", "."}, {"commit", "-qm", "v1"}, {"tag", tag}} {
		git(t, work, env, args...)
	}
	git(t, work, env, "clone", "-q", "--bare", work, filepath.Join(s.Dir, filepath.FromSlash(name)))
}

// ClientHome writes a home directory whose git and ssh configuration reach
// the server for URLs under https://host/ (git's insteadOf), with the host
// key pinned. It holds no private key.
func (s *GitServer) ClientHome(t testing.TB, host string) string {
	t.Helper()
	home := t.TempDir()
	hostname, port, _ := net.SplitHostPort(s.Addr)
	Write(t, home, map[string]string{
		".gitconfig":       fmt.Sprintf("[url \"ssh://git@%s/\"]\n\tinsteadOf = https://%s/\n", s.Addr, host),
		".ssh/config":      "Host " + hostname + "\n\tPort " + port + "\n\tUser git\n\tIdentitiesOnly no\n",
		".ssh/known_hosts": fmt.Sprintf("[%s]:%s %s", hostname, port, ssh.MarshalAuthorizedKey(s.HostKey)),
	})
	os.Chmod(filepath.Join(home, ".ssh"), 0o700)
	return home
}

func git(t testing.TB, dir string, env []string, args ...string) {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}
