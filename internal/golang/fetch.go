package golang

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/log"
	"github.com/moby/buildkit/session"
	"github.com/moby/buildkit/session/secrets/secretsprovider"
	"github.com/moby/buildkit/session/sshforward/sshprovider"

	"github.com/kiln-build/kiln/internal/atomicfile"
	"github.com/kiln-build/kiln/internal/plan"
)

// LocalVCSTools is the local source of the root filesystem with git and ssh.
const LocalVCSTools = "vcs-tools"

// Where the download step sees the caller's SSH agent and file:// proxies.
const (
	sshAgentSocket = "/run/kiln/ssh-agent.sock"
	proxyMountDir  = "/kiln/goproxy"
)

// fetchSecrets are the credential files the download step may read. They are
// BuildKit secrets: mounted into that step only, never part of a cache key,
// a layer or the definition. Every one is always declared (optional), so the
// definition is the same on machines that lack some of them.
var fetchSecrets = []struct{ id, dest string }{
	{"kiln-netrc", "/root/.netrc"},
	{"kiln-gitconfig", "/root/.gitconfig"},
	{"kiln-ssh-config", "/root/.ssh/config"},
	{"kiln-ssh-known-hosts", "/root/.ssh/known_hosts"},
}

// Fetch is how the module download step reaches modules, derived from the
// caller's Go environment.
type Fetch struct {
	// Env is the caller's module environment for the download step, with
	// file:// proxies rewritten to where the step sees them and the
	// credentials of proxy URLs moved into the netrc secret.
	Env []string
	// Proxies are the GOPROXY directories (file:// entries).
	Proxies []Proxy
	// Offline is true when every GOPROXY entry is a directory (or off) and
	// nothing is fetched directly: the step then runs without network.
	Offline bool
	// Direct is true when some module may come straight from its VCS
	// (GOPROXY has direct, or GOPRIVATE/GONOPROXY are set).
	Direct bool
	// Tools is a root filesystem with this machine's git and ssh, for Direct
	// fetches; empty when git is not installed. The modules it fetches are
	// checked against go.sum, so the tools do not reach any output.
	Tools string
	// Secrets are the credential files by secret id.
	Secrets map[string][]byte
	// SSHAgent is the caller's SSH agent socket, forwarded when Direct.
	SSHAgent string
}

// Proxy is one file:// GOPROXY directory, sent as a read-only local source.
type Proxy struct {
	Local string // local source name
	Dir   string // directory on this machine
	Mount string // where the download step sees it
}

// ResolveFetch prepares the module download for the caller's Go module
// environment (plan.Host's GoEnv: `go env` of plan.ModuleEnvKeys).
func ResolveFetch(ctx context.Context, cacheDir string, goEnv map[string]string) (*Fetch, error) {
	keys := plan.ModuleEnvKeys
	env := maps.Clone(goEnv)
	if env == nil {
		env = map[string]string{}
	}
	f := &Fetch{Secrets: map[string][]byte{}}
	var netrc bytes.Buffer
	proxy, err := f.rewriteProxy(env["GOPROXY"], &netrc)
	if err != nil {
		return nil, err
	}
	env["GOPROXY"] = proxy
	f.Direct = f.Direct || env["GOPRIVATE"] != "" || env["GONOPROXY"] != ""
	f.Offline = f.Offline && !f.Direct
	// go mod download reads no build flag, and the plan's go list takes
	// none of the host's either: with them (a -gcflags) the download step and
	// the module layer would get another key for the same modules. The
	// cache must stay removable.
	env["GOFLAGS"] = "-modcacherw"
	for _, k := range slices.Sorted(slices.Values(keys)) {
		if env[k] != "" {
			f.Env = append(f.Env, k+"="+env[k])
		}
	}

	home, _ := os.UserHomeDir()
	hostNetrc := os.Getenv("NETRC")
	if hostNetrc == "" && home != "" {
		hostNetrc = filepath.Join(home, ".netrc")
	}
	// Only the machines this download may contact: the proxies and the
	// hosts of private modules. Other credentials stay on this machine.
	private := strings.TrimSpace(env["GOPRIVATE"] + "," + env["GONOPROXY"])
	hosts := proxyHosts(env["GOPROXY"])
	if dt, err := os.ReadFile(hostNetrc); err == nil {
		netrc.Write(filterNetrc(dt, func(machine string) bool { return hosts[machine] || privateHost(private, machine) }))
	}
	if netrc.Len() > 0 {
		f.Secrets["kiln-netrc"] = netrc.Bytes()
	}
	if !f.Direct {
		return f, nil
	}
	if f.Tools, err = VCSTools(cacheDir); err != nil {
		log.G(ctx).Warnf("modules fetched directly need git: %v", err)
		f.Tools = ""
	}
	// Git and SSH credentials only when modules are private: go's default
	// GOPROXY ends in "direct", which alone must not forward them.
	if strings.Trim(private, ", ") == "" && os.Getenv(ForwardGitEnv) != "1" {
		return f, nil
	}
	gitconfig := os.Getenv("GIT_CONFIG_GLOBAL")
	if gitconfig == "" && home != "" {
		gitconfig = filepath.Join(home, ".gitconfig")
	}
	for id, path := range map[string]string{
		"kiln-gitconfig":       gitconfig,
		"kiln-ssh-config":      filepath.Join(home, ".ssh", "config"),
		"kiln-ssh-known-hosts": filepath.Join(home, ".ssh", "known_hosts"),
	} {
		if dt, err := os.ReadFile(path); err == nil && home != "" {
			f.Secrets[id] = dt
		}
	}
	f.SSHAgent = os.Getenv("SSH_AUTH_SOCK")
	return f, nil
}

// ForwardGitEnv forwards the SSH agent and git configuration to the
// download step even when no module is private (GOPRIVATE, GONOPROXY).
const ForwardGitEnv = "KILN_FORWARD_GIT_CREDENTIALS"

// privateHost reports whether machine is the host of a GOPRIVATE or
// GONOPROXY pattern (their first path element, a glob).
func privateHost(patterns, machine string) bool {
	for _, p := range strings.Split(patterns, ",") {
		host, _, _ := strings.Cut(strings.TrimSpace(p), "/")
		if ok, _ := path.Match(host, machine); ok && host != "" {
			return true
		}
	}
	return false
}

// proxyHosts are the hosts of the http(s) entries of a GOPROXY list.
func proxyHosts(goproxy string) map[string]bool {
	hosts := map[string]bool{}
	for _, e := range plan.ProxyEntries(goproxy) {
		if u, err := url.Parse(e.URL); err == nil && (u.Scheme == "https" || u.Scheme == "http") {
			hosts[u.Hostname()] = true
		}
	}
	return hosts
}

// filterNetrc keeps the machine entries whose host keep accepts; "default"
// entries, which would answer any host, are dropped.
func filterNetrc(data []byte, keep func(machine string) bool) []byte {
	var out bytes.Buffer
	fields := strings.Fields(string(data))
	for i := 0; i < len(fields); {
		if fields[i] != "machine" && fields[i] != "default" {
			i++
			continue
		}
		start, machine := i, ""
		if fields[i] == "machine" && i+1 < len(fields) {
			machine = fields[i+1]
			i++
		}
		i++
		for i < len(fields) && fields[i] != "machine" && fields[i] != "default" {
			i++
		}
		if machine != "" && keep(machine) {
			out.WriteString(strings.Join(fields[start:i], " ") + "\n")
		}
	}
	return out.Bytes()
}

// rewriteProxy maps file:// entries to mounts and moves URL credentials
// into netrc lines; it sets Offline and Direct from the entries.
func (f *Fetch) rewriteProxy(goproxy string, netrc io.Writer) (string, error) {
	f.Offline = true
	var out strings.Builder
	for _, e := range plan.ProxyEntries(goproxy) {
		entry, sep := e.URL, e.Sep
		switch {
		case entry == "off" || entry == "":
		case entry == "direct":
			f.Direct = true
		case strings.HasPrefix(entry, "file://"):
			u, err := url.Parse(entry)
			if err != nil || u.Path == "" {
				return "", fmt.Errorf("GOPROXY entry %s: not a file:///absolute/path URL", entry)
			}
			if fi, err := os.Stat(u.Path); err != nil || !fi.IsDir() {
				return "", fmt.Errorf("GOPROXY entry %s: %s is not a directory; point it at a module proxy directory (the layout of $GOMODCACHE/cache/download)", entry, u.Path)
			}
			p := Proxy{Local: "goproxy-" + strconv.Itoa(len(f.Proxies)), Dir: u.Path, Mount: proxyMountDir + "/" + strconv.Itoa(len(f.Proxies))}
			f.Proxies = append(f.Proxies, p)
			entry = "file://" + p.Mount
		default:
			f.Offline = false
			if u, err := url.Parse(entry); err == nil && u.User != nil {
				pass, _ := u.User.Password()
				fmt.Fprintf(netrc, "machine %s login %s password %s\n", u.Hostname(), u.User.Username(), pass)
				u.User = nil
				entry = u.String()
			}
		}
		out.WriteString(entry + sep)
	}
	return out.String(), nil
}

// Locals are the local sources the download step needs.
func (f *Fetch) Locals() map[string]string {
	m := map[string]string{}
	for _, p := range f.Proxies {
		m[p.Local] = p.Dir
	}
	if f.Tools != "" {
		m[LocalVCSTools] = f.Tools
	}
	return m
}

// Attachables give the download step its secrets and the SSH agent.
func (f *Fetch) Attachables() ([]session.Attachable, error) {
	var out []session.Attachable
	if len(f.Secrets) > 0 {
		out = append(out, secretsprovider.FromMap(f.Secrets))
	}
	if f.SSHAgent != "" {
		sp, err := sshprovider.NewSSHAgentProvider([]sshprovider.AgentConfig{{ID: "default", Paths: []string{f.SSHAgent}}})
		if err != nil {
			return nil, fmt.Errorf("SSH_AUTH_SOCK=%s: %w; start an agent (eval $(ssh-agent); ssh-add) or unset SSH_AUTH_SOCK", f.SSHAgent, err)
		}
		out = append(out, sp)
	}
	return out, nil
}

// VCSTools gathers this machine's git and ssh with the libraries they load
// into a root filesystem under cacheDir, reused while the binaries are the same.
func VCSTools(cacheDir string) (string, error) {
	git, err := exec.LookPath("git")
	if err != nil {
		return "", fmt.Errorf("git is not installed (apt-get install git)")
	}
	bins := []string{git}
	if ssh, err := exec.LookPath("ssh"); err == nil {
		bins = append(bins, ssh)
	}
	index := filepath.Join(cacheDir, "vcs-tools", "index.json")
	roots := slices.Clone(bins)
	if dir, ok := knownVCSTools(cacheDir, index, roots); ok {
		return dir, nil
	}
	var execDir string
	if out, err := exec.Command(git, "--exec-path").Output(); err == nil {
		exe := strings.TrimSpace(string(out))
		execDir = exe
		for _, name := range []string{"git", "git-remote-http", "git-remote-https"} {
			if _, err := os.Stat(filepath.Join(exe, name)); err == nil {
				bins = append(bins, filepath.Join(exe, name))
			}
		}
	}
	files := map[string]bool{}
	for _, b := range bins {
		files[b] = true
		libs, err := sharedLibraries(b)
		if err != nil {
			return "", err
		}
		for _, l := range libs {
			files[l] = true
		}
	}
	paths := slices.Sorted(func(yield func(string) bool) {
		for p := range files {
			if !yield(p) {
				return
			}
		}
	})
	dir, err := vcsToolsDir(cacheDir, paths)
	if err != nil {
		return "", err
	}
	defer writeVCSToolsIndex(index, vcsToolsIndex{Bins: roots, Env: vcsToolsEnv(), ExecDir: execDir, ExecDirMod: modTime(execDir), Paths: paths, Dir: dir})
	if _, err := os.Stat(filepath.Join(dir, "etc", "passwd")); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "tmp-*")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	for _, p := range paths {
		if err := copyFile(p, filepath.Join(tmp, p)); err != nil {
			return "", err
		}
	}
	// ssh looks its user up; git and ssh need a home.
	for name, content := range map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\n",
		"etc/group":  "root:x:0:\n",
	} {
		if err := os.MkdirAll(filepath.Join(tmp, "etc"), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(tmp, name), []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	if err := os.MkdirAll(filepath.Join(tmp, "root"), 0o700); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil && !os.IsExist(err) {
		if _, statErr := os.Stat(filepath.Join(dir, "etc", "passwd")); statErr != nil {
			return "", err
		}
	}
	return dir, nil
}

// vcsToolsDir names the folder of these files by their paths and stats.
func vcsToolsDir(cacheDir string, paths []string) (string, error) {
	h := sha256.New()
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d %d\n", p, fi.Size(), fi.ModTime().UnixNano())
	}
	return filepath.Join(cacheDir, "vcs-tools", hex.EncodeToString(h.Sum(nil))[:16]), nil
}

// vcsToolsIndex is what the last VCSTools found: git's helpers and the
// shared libraries (from git --exec-path and ldd, six processes, 30 ms of
// every build). While every file is as it was, the same folder holds them.
type vcsToolsIndex struct {
	Bins []string `json:"bins"`
	// Env is what else decides which files git and ldd name, and ExecDir
	// git's helpers' folder: a helper installed there changes its time.
	Env        []string `json:"env"`
	ExecDir    string   `json:"execDir"`
	ExecDirMod int64    `json:"execDirMod"`
	Paths      []string `json:"paths"`
	Dir        string   `json:"dir"`
}

func vcsToolsEnv() []string {
	return []string{"GIT_EXEC_PATH=" + os.Getenv("GIT_EXEC_PATH"), "LD_LIBRARY_PATH=" + os.Getenv("LD_LIBRARY_PATH")}
}

func modTime(path string) int64 {
	if fi, err := os.Stat(path); err == nil {
		return fi.ModTime().UnixNano()
	}
	return 0
}

func knownVCSTools(cacheDir, index string, bins []string) (string, bool) {
	data, err := os.ReadFile(index)
	if err != nil {
		return "", false
	}
	var idx vcsToolsIndex
	if json.Unmarshal(data, &idx) != nil || !slices.Equal(idx.Bins, bins) || !slices.Equal(idx.Env, vcsToolsEnv()) || modTime(idx.ExecDir) != idx.ExecDirMod {
		return "", false
	}
	dir, err := vcsToolsDir(cacheDir, idx.Paths)
	if err != nil || dir != idx.Dir {
		return "", false
	}
	if _, err := os.Stat(filepath.Join(dir, "etc", "passwd")); err != nil {
		return "", false
	}
	return dir, true
}

func writeVCSToolsIndex(path string, idx vcsToolsIndex) {
	data, err := json.Marshal(idx)
	if err != nil {
		return
	}
	// The index only saves time: a failed write leaves the next build to
	// find the files again.
	atomicfile.Write(path, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// sharedLibraries lists the absolute paths ldd reports for a binary.
func sharedLibraries(bin string) ([]string, error) {
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		return nil, nil // static, or no ldd: nothing to add
	}
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		for _, field := range strings.Fields(sc.Text()) {
			if strings.HasPrefix(field, "/") {
				libs = append(libs, field)
			}
		}
	}
	return libs, nil
}

// copyFile copies the content (following symlinks) to dest, keeping the mode.
func copyFile(src, dest string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dest, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
