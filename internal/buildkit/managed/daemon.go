// Package managed owns the local buildkitd kiln starts when BUILDKIT_HOST
// is unset: building it from the tools module kiln embeds (with what kiln
// never runs cut out), starting, finding and stopping it, runc, and the
// daemon's status and prune; Connect picks it or BUILDKIT_HOST.
package managed

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/log"
	"github.com/moby/buildkit/client"

	"github.com/kiln-build/kiln/internal/atomicfile"
	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/uptodate"
)

// Version is the buildkitd kiln manages; tools/buildkitd.mod pins the same.
const Version = "v0.34.2"

// The module that builds buildkitd travels inside kiln, so a repository that
// imports kiln's targets needs no copy of it. It is named .mod, not go.mod:
// a go.mod would make the folder a module of its own, out of embed's reach.
//
//go:embed tools/buildkitd.mod
var toolsGoMod []byte

//go:embed tools/buildkitd.sum
var toolsGoSum []byte

// defaultConfig configures the managed daemon when the project has no
// build/buildkitd.toml of its own.
//
//go:embed tools/buildkitd.toml
var defaultConfig []byte

// Managed describes the local buildkitd kiln starts when BUILDKIT_HOST is unset.
type Managed struct {
	// Dir holds the daemon's state, socket, pid file, log and lock.
	Dir string
	// BinDir caches the buildkitd binary, built from kiln's embedded tools module.
	BinDir string
	// Config is the project's build/buildkitd.toml, else kiln's default
	// written under Dir.
	Config string
}

// DefaultManaged places the managed daemon under the user cache dir,
// configured by projectRoot's build/buildkitd.toml when there is one.
func DefaultManaged(projectRoot string) (*Managed, error) {
	cache, err := buildkit.CacheDir()
	if err != nil {
		return nil, err
	}
	return &Managed{
		Dir:    filepath.Join(cache, "buildkit"),
		BinDir: filepath.Join(cache, "bin"),
		Config: ProjectConfig(projectRoot),
	}, nil
}

// ProjectConfig is projectRoot's build/buildkitd.toml, or "" when it has none.
func ProjectConfig(projectRoot string) string {
	path := filepath.Join(projectRoot, "build", "buildkitd.toml")
	if _, err := os.Stat(path); err != nil {
		return ""
	}
	return path
}

// ConfigFile returns the daemon's configuration file, writing kiln's default
// under Dir when the project has none.
func (m *Managed) ConfigFile() (string, error) {
	if m.Config != "" {
		return m.Config, nil
	}
	if err := os.MkdirAll(m.Dir, 0o700); err != nil {
		return "", err
	}
	path := filepath.Join(m.Dir, "buildkitd.toml")
	if err := os.WriteFile(path, defaultConfig, 0o600); err != nil {
		return "", err
	}
	return path, nil
}

func (m *Managed) socket() string  { return filepath.Join(m.Dir, "buildkitd.sock") }
func (m *Managed) pidFile() string { return filepath.Join(m.Dir, "buildkitd.pid") }

// LogFile is where the managed daemon writes its log.
func (m *Managed) LogFile() string { return filepath.Join(m.Dir, "buildkitd.log") }

// Address is the managed daemon's BUILDKIT_HOST-style address.
func (m *Managed) Address() string { return "unix://" + m.socket() }

// Binary is the path of the cached buildkitd binary.
func (m *Managed) Binary() string {
	return filepath.Join(m.BinDir, "buildkitd-"+Version+"-"+binaryKey())
}

// Ensure returns a client of a running managed daemon, starting it when
// needed. A file lock makes concurrent callers start one daemon.
func (m *Managed) Ensure(ctx context.Context) (*client.Client, error) {
	if err := os.MkdirAll(m.Dir, 0o700); err != nil {
		return nil, err
	}
	unlock, err := buildkit.LockFile(ctx, filepath.Join(m.Dir, "lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()

	if c, err := m.connect(ctx, 2*time.Second); err == nil {
		if pid, ok := m.Running(); ok {
			if exe, _ := m.exe(pid); filepath.Base(exe) != filepath.Base(m.Binary()) {
				log.G(ctx).Warnf("the managed buildkitd (pid %d) runs %s, which another kiln built; this kiln's is %s: run `go run mage.go buildkit:stop`, and the next build starts this one", pid, filepath.Base(exe), filepath.Base(m.Binary()))
			}
			if name, changed := m.configChanged(); changed {
				log.G(ctx).Warnf("the managed buildkitd (pid %d) started with other settings than %s holds, and buildkitd reads them only at start: run `go run mage.go buildkit:stop`, and the next build starts it with these", pid, name)
			}
		}
		return c, nil
	}
	if err := ensureRunc(ctx); err != nil {
		return nil, err
	}
	if err := m.EnsureBinary(ctx); err != nil {
		return nil, err
	}
	if err := buildkit.TrustedDir(m.BinDir); err != nil {
		return nil, err
	}
	if err := m.start(ctx); err != nil {
		return nil, err
	}
	c, err := m.connect(ctx, 60*time.Second)
	if err != nil {
		return nil, fmt.Errorf("managed buildkitd did not answer on %s: %w\n%s", m.Address(), err, buildkit.Tail(m.LogFile(), 20))
	}
	return c, nil
}

// connect dials the socket and waits until the daemon answers.
func (m *Managed) connect(ctx context.Context, wait time.Duration) (*client.Client, error) {
	deadline := time.Now().Add(wait)
	var lastErr error
	for {
		if _, err := os.Stat(m.socket()); err == nil {
			c, err := client.New(ctx, m.Address())
			if err == nil {
				pingCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, err = c.ListWorkers(pingCtx)
				cancel()
				if err == nil {
					return c, nil
				}
				c.Close()
			}
			lastErr = err
		} else {
			lastErr = err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, lastErr
		}
		if pid, ok := m.PID(); ok && !atomicfile.Alive(pid) && time.Since(deadline.Add(-wait)) > time.Second {
			return nil, fmt.Errorf("buildkitd (pid %d) exited", pid)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// PID returns the pid from the pid file.
func (m *Managed) PID() (int, bool) {
	b, err := os.ReadFile(m.pidFile())
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid, err == nil && pid > 0
}

// Running reports whether the managed daemon's process is alive. A pid
// file can outlive its process (a reboot, a kill -9) and the pid be reused:
// only a process running a buildkitd kiln built into BinDir on this state
// directory counts, so kiln never signals anyone else's process.
func (m *Managed) Running() (int, bool) {
	pid, ok := m.PID()
	return pid, ok && atomicfile.Alive(pid) && m.owns(pid)
}

// owns reports whether pid is this Managed's buildkitd: a buildkitd kiln
// built into BinDir, this kiln's or an older one's (its file is named by
// what it was built from, so an upgrade leaves the daemon running on the
// old file, and buildkit:stop must still stop it), on this state directory.
func (m *Managed) owns(pid int) bool {
	if _, ok := m.exe(pid); !ok {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	return bytes.Contains(cmdline, []byte("\x00--root\x00"+m.stateDir()+"\x00"))
}

// exe is the kiln-built buildkitd in BinDir that pid runs: the file of
// that name in BinDir must be the very file pid runs (a path string alone
// can name another mount namespace's file, or a symlinked cache dir differ).
func (m *Managed) exe(pid int) (string, bool) {
	link, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil || !strings.HasPrefix(filepath.Base(link), "buildkitd-") {
		return "", false
	}
	running, err := os.Stat(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return "", false
	}
	candidate := filepath.Join(m.BinDir, filepath.Base(link))
	if fi, err := os.Stat(candidate); err != nil || !os.SameFile(running, fi) {
		return "", false
	}
	return candidate, true
}

func (m *Managed) stateDir() string { return filepath.Join(m.Dir, "state") }

// EnsureBinary builds buildkitd from kiln's tools module into the cache once. A
// lock in the cache makes concurrent callers (daemons with other state
// dirs, parallel test packages) build it once.
func (m *Managed) EnsureBinary(ctx context.Context) error {
	if err := m.checkBinary(); err == nil {
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.MkdirAll(m.BinDir, 0o755); err != nil {
		return err
	}
	unlock, err := buildkit.LockFile(ctx, filepath.Join(m.BinDir, ".lock"))
	if err != nil {
		return err
	}
	defer unlock()
	if err := m.checkBinary(); err == nil {
		return nil // built while we waited
	}
	log.G(ctx).Warnf("first run: building buildkitd %s into %s (once; under two minutes on two cores, longer with a cold module cache)", Version, m.BinDir)
	tools, err := os.MkdirTemp(m.BinDir, "tools-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tools)
	if err := os.WriteFile(filepath.Join(tools, "go.mod"), toolsGoMod, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tools, "go.sum"), toolsGoSum, 0o644); err != nil {
		return err
	}
	tmp := m.Binary() + ".tmp"
	// The version BuildKit reports (buildctl debug info, the bench's
	// machine facts) is set at link time; unset, it is v0.0.0+unknown.
	// Compiled as mage compiled kiln's targets a moment ago (no -trimpath,
	// no -gcflags), so the packages both use come from the Go build cache;
	// with the patch's cuts, 106 s on two cores where the whole buildkitd
	// took 172 s. Its paths
	// matter to nobody: buildkitd is a tool, never an output. -s -w: a
	// shorter link and a smaller file.
	env := append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-mod=readonly")
	if err := writePatchedCommand(ctx, tools, env); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build",
		"-ldflags=-s -w -X github.com/moby/buildkit/version.Version="+Version, "-o", tmp, "./"+patchedCommand)
	cmd.Dir, cmd.Env = tools, env
	// A build of a minute or more says it is still going.
	start, done := time.Now(), make(chan struct{})
	go func() {
		t := time.NewTicker(20 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				log.G(ctx).Warnf("first run: still building buildkitd %s (%s so far)", Version, time.Since(start).Round(time.Second))
			}
		}
	}()
	out, err := cmd.CombinedOutput()
	close(done)
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("build buildkitd %s: %w\n%s", Version, err, out)
	}
	sum, err := uptodate.FileSHA256(tmp)
	if err != nil {
		return err
	}
	if err := os.WriteFile(m.Binary()+".sha256", []byte(sum+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, m.Binary())
}

// checkBinary checks the cached buildkitd against the sha256 recorded when
// kiln built it; os.ErrNotExist when there is none yet.
func (m *Managed) checkBinary() error {
	// Without a record (a binary kiln did not build, or an older kiln's)
	// the binary counts as missing and is built again over it.
	want, err := os.ReadFile(m.Binary() + ".sha256")
	if err != nil {
		return err
	}
	got, err := uptodate.FileSHA256(m.Binary())
	if err != nil {
		return err
	}
	if got != strings.TrimSpace(string(want)) {
		return fmt.Errorf("%s changed since kiln built it (sha256 %s, recorded %s): remove it and kiln builds it again", m.Binary(), got, strings.TrimSpace(string(want)))
	}
	return nil
}

// start launches buildkitd detached, so it outlives this invocation.
func (m *Managed) start(ctx context.Context) error {
	if pid, ok := m.Running(); ok {
		// Our daemon holds the pid file but does not answer: it is wedged.
		log.G(ctx).Warnf("buildkitd (pid %d) does not answer; restarting it", pid)
		m.kill(pid)
	}
	m.reapSteps(ctx)
	os.Remove(m.socket())
	config, err := m.ConfigFile()
	if err != nil {
		return err
	}
	// The log is capped: past maxLog it is moved aside, one generation kept.
	if fi, err := os.Stat(m.LogFile()); err == nil && fi.Size() > maxLog {
		os.Rename(m.LogFile(), m.LogFile()+".1")
	}
	logf, err := os.OpenFile(m.LogFile(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	// What the daemon started with, so that a later build can tell the
	// user it runs settings the file no longer holds.
	sum, err := uptodate.FileSHA256(config)
	if err != nil {
		return err
	}
	if err := os.WriteFile(m.configRecord(), []byte(sum+"\n"), 0o600); err != nil {
		return err
	}
	args := []string{
		"--root", m.stateDir(),
		"--addr", m.Address(),
		"--config", config,
		"--oci-worker=true",
	}
	cmd := exec.Command(m.Binary(), args...)
	cmd.Env = daemonEnv(os.Environ())
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", m.Binary(), err)
	}
	log.G(ctx).Infof("started buildkitd %s (pid %d) on %s; log: %s", Version, cmd.Process.Pid, m.Address(), m.LogFile())
	if err := os.WriteFile(m.pidFile(), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o600); err != nil {
		return err
	}
	return cmd.Process.Release()
}

// reapSteps ends the build steps a previous daemon on this state left
// behind. A killed buildkitd (SIGKILL, the OOM killer) leaves its runc
// containers running, and a step of the new daemon would share their
// cache mounts: a locked mount has one writer only within one daemon, so
// a go build of the old one could go on writing the kept binaries, and
// delete the work folder, that the new one's go build is using.
func (m *Managed) reapSteps(ctx context.Context) {
	state, err := filepath.EvalSymlinks(m.stateDir())
	if err != nil {
		return // no state yet: no steps
	}
	// A buildkitd that still runs on this state (one Running does not
	// know as ours) holds its lock: its steps are its own.
	lock, err := os.Open(filepath.Join(state, "buildkitd.lock"))
	if err != nil {
		return // no daemon ever ran here
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return
	}
	// BuildKit runs runc (the first on the daemon's PATH, with the
	// runtime folder of its environment, no --root) with a bundle per
	// step under the executor folder of --root. A worker.oci.binary
	// other than runc keeps its state elsewhere: its steps are left.
	runc := func(args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, "runc", args...)
		cmd.Env = daemonEnv(os.Environ())
		return cmd
	}
	var containers []struct {
		ID     string `json:"id"`
		Status string `json:"status"`
		Bundle string `json:"bundle"`
	}
	out, err := runc("list", "--format", "json").Output()
	if err == nil {
		err = json.Unmarshal(out, &containers)
	}
	if err != nil {
		log.G(ctx).Warnf("runc list: %v; build steps of an earlier buildkitd on %s, if any, are left running", err, state)
		return
	}
	running := 0
	for _, c := range containers {
		if !strings.HasPrefix(c.Bundle, state+string(filepath.Separator)) {
			continue
		}
		if c.Status != "stopped" {
			running++
		}
		if out, err := runc("delete", "--force", c.ID).CombinedOutput(); err != nil {
			log.G(ctx).Warnf("runc delete --force %s (a build step of an earlier buildkitd): %v: %s", c.ID, err, bytes.TrimSpace(out))
		}
	}
	if running > 0 {
		log.G(ctx).Warnf("ended %d build step(s) that an earlier buildkitd on %s left running", running, state)
	}
}

// configRecord holds the sha256 of the configuration the daemon started with.
func (m *Managed) configRecord() string { return filepath.Join(m.Dir, "buildkitd.toml.sha256") }

// configChanged reports whether the configuration kiln would start the
// daemon with differs from the one the running daemon started with, and
// names it. A daemon an older kiln started has no record: nothing to say.
func (m *Managed) configChanged() (string, bool) {
	started, err := os.ReadFile(m.configRecord())
	if err != nil {
		return "", false
	}
	name, content := m.Config, defaultConfig
	if name == "" {
		name = "kiln's default buildkitd.toml"
	} else if content, err = os.ReadFile(name); err != nil {
		return "", false
	}
	sum := sha256.Sum256(content)
	return name, hex.EncodeToString(sum[:]) != strings.TrimSpace(string(started))
}

// daemonEnvNames and daemonEnvPrefixes are what a long-lived daemon takes
// of the environment of the command that happened to start it: what finds
// runc and temporary space, the Go runtime's and its own settings, proxies
// and CA certificates, tracing. Nothing else: its /proc/PID/environ
// outlives that command, and tokens (GITHUB_TOKEN, AWS_*), signing keys
// and passwords, or an SSH agent have no business there.
var (
	daemonEnvNames = []string{"PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "TZ", "LANG",
		"XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME",
		"GOGC", "GOMEMLIMIT", "GOMAXPROCS", "GODEBUG", "GOTRACEBACK",
		"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
		"SSL_CERT_FILE", "SSL_CERT_DIR"}
	daemonEnvPrefixes = []string{"LC_", "BUILDKIT_", "OTEL_"}
)

func daemonEnv(env []string) []string {
	var out []string
	gogc := false
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		allowed := slices.Contains(daemonEnvNames, name) || slices.ContainsFunc(daemonEnvPrefixes, func(p string) bool { return strings.HasPrefix(name, p) })
		// OTLP headers carry the collector's bearer tokens.
		allowed = allowed && !strings.HasSuffix(name, "_HEADERS")
		// The patch cut the jaeger exporter; asked for, it would stop
		// the daemon from starting, for traces nobody reads here.
		jaeger := name == "OTEL_TRACES_EXPORTER" && value == "jaeger"
		if allowed && !jaeger {
			out = append(out, kv)
		}
		gogc = gogc || name == "GOGC"
	}
	// The daemon sits beside the compiles it runs: a tighter heap target
	// than Go's default (100) keeps its share of a build's peak memory
	// small, for little CPU. A GOGC of the caller's own wins.
	if !gogc {
		out = append(out, "GOGC=50")
	}
	return out
}

// Stop terminates the managed daemon and waits for it to exit.
func (m *Managed) Stop(ctx context.Context) (bool, error) {
	// The start lock: a daemon that is starting is not stopped half-way.
	if err := os.MkdirAll(m.Dir, 0o700); err != nil {
		return false, err
	}
	unlock, err := buildkit.LockFile(ctx, filepath.Join(m.Dir, "lock"))
	if err != nil {
		return false, err
	}
	defer unlock()
	pid, ok := m.Running()
	if !ok {
		os.Remove(m.pidFile())
		return false, nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return false, fmt.Errorf("stop buildkitd (pid %d): %w", pid, err)
	}
	for i := 0; i < 100 && atomicfile.Alive(pid); i++ {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	if atomicfile.Alive(pid) {
		m.kill(pid)
	}
	os.Remove(m.pidFile())
	return true, nil
}

func (m *Managed) kill(pid int) {
	syscall.Kill(pid, syscall.SIGKILL)
	for i := 0; i < 50 && atomicfile.Alive(pid); i++ {
		time.Sleep(100 * time.Millisecond)
	}
}

// maxLog caps buildkitd.log before a start moves it aside.
const maxLog = 16 << 20

// InstallEnv lets kiln install what the managed daemon needs (runc) with
// apt-get; without it kiln names the command and stops.
const InstallEnv = "KILN_INSTALL"

// Seams for tests of the runc check.
var (
	lookPath = exec.LookPath
	geteuid  = os.Geteuid
)

// ensureRunc finds runc. It installs Debian's package only when asked to
// (KILN_INSTALL=1 or `mage buildkit:setup`): a build never changes the system
// unasked.
func ensureRunc(ctx context.Context) error {
	if _, err := lookPath("runc"); err == nil {
		return nil
	}
	if os.Getenv(InstallEnv) != "1" {
		return fmt.Errorf("runc not found in PATH; the managed buildkitd needs it to run build steps; install it: apt-get install -y runc (Debian/Ubuntu), or run `go run mage.go buildkit:setup` (or set %s=1) to let kiln install it", InstallEnv)
	}
	return InstallRunc(ctx)
}

// InstallRunc installs Debian's runc package when it is missing.
func InstallRunc(ctx context.Context) error {
	if _, err := lookPath("runc"); err == nil {
		return nil
	}
	const remedy = "install it: apt-get install -y runc (Debian/Ubuntu), or put a runc binary on PATH"
	_, debian := os.Stat("/etc/debian_version")
	if geteuid() != 0 || debian != nil {
		return fmt.Errorf("runc not found in PATH, and kiln installs it only as root on Debian; %s", remedy)
	}
	log.G(ctx).Warn("runc not found in PATH; installing the Debian package runc (apt-get install -y runc)")
	for _, args := range [][]string{{"update", "-qq"}, {"install", "-y", "-qq", "runc"}} {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get %s failed: %w\n%s\nrunc is still missing; %s", strings.Join(args, " "), err, out, remedy)
		}
	}
	if _, err := lookPath("runc"); err != nil {
		return fmt.Errorf("runc not found in PATH after installing it; %s", remedy)
	}
	return nil
}
