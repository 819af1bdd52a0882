// Command kiln-mage runs kiln's mage targets: `go run mage.go ARGS` at a
// repository's root runs `go tool -C magefiles kiln-mage ARGS`, a tool of
// magefiles/go.mod, which runs mage from magefiles/ (whose go.mod holds kiln
// and its BuildKit and containerd graph, so the product's go.mod never lists
// them) with the targets working in the root. When nothing the targets are
// built from changed since they last started, it runs them without mage.
package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kiln-build/kiln/targets/internal/magerun"
)

func main() {
	// go tool -C magefiles starts this in magefiles/ (leaving PWD as it
	// was); the targets work in the repository's root, and the record is
	// named after it.
	if err := os.Chdir(".."); err != nil {
		fail(err)
	}
	root, err := os.Getwd()
	if err != nil {
		fail(err)
	}
	os.Setenv("PWD", root)
	args := os.Args[1:]

	// Mage checks its binary with a go build, which hashes BuildKit's and
	// containerd's graph to find it current: over a second, most of a
	// typed no-op. The fingerprint below makes that check unnecessary
	// while nothing changed.
	stamp := stampPath(root)
	fingerprint, why := inputsFingerprint()
	switch {
	case len(args) == 0 || strings.HasPrefix(args[0], "-"):
		why = "a mage flag or no target"
	case stamp == "":
		why = "no cache folder for the record"
	case fingerprint != "":
		var exe string
		if exe, why = upToDate(stamp, fingerprint); why == "" {
			debugf("nothing the targets are built from changed: running %s without mage", exe)
			why = runTargets(exe, args)
		}
	}
	debugf("running mage: %s", why)
	cmd := exec.Command("go", append([]string{"tool", "-C", "magefiles", "mage", "-d", ".", "-w", ".."}, args...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = os.Environ()
	if stamp != "" && fingerprint != "" {
		cmd.Env = append(cmd.Env, magerun.StampEnv+"="+stamp, magerun.FingerprintEnv+"="+fingerprint)
	}
	// Until the targets start (and remove the marker), mage is compiling
	// them, silently, for a minute on a fresh machine: say so.
	done := make(chan struct{})
	var marker string
	if f, err := os.CreateTemp("", "kiln-mage-"); err == nil {
		f.Close()
		marker = f.Name()
		cmd.Env = append(cmd.Env, magerun.StartedEnv+"="+marker)
		go sayCompiling(marker, done)
	}
	// Mage lists each //mage:import package twice with go list, which loads
	// BuildKit's and containerd's whole import graph every time (0.1 s a
	// call); with -find it names a package and its files, all mage reads
	// (0.03 s). go applies a GOFLAGS flag only to the commands that know it,
	// so no go build sees it; the targets put the user's GOFLAGS back.
	goflags, set := os.LookupEnv("GOFLAGS")
	saved := "unset"
	if set {
		saved = "=" + goflags
	}
	cmd.Env = append(cmd.Env, magerun.GoflagsEnv+"="+saved, "GOFLAGS="+strings.TrimSpace(goflags+" -find"))
	waitOnly()
	err = cmd.Run()
	close(done)
	if marker != "" {
		os.Remove(marker) // still there when mage failed before the targets ran
	}
	exit(err)
}

// exit leaves with the exit code of the command that ran.
func exit(err error) {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		os.Exit(exit.ExitCode())
	}
	if err != nil {
		fail(err)
	}
	os.Exit(0)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "kiln-mage:", err)
	os.Exit(1)
}

// sayCompiling prints a line once the targets have not started for 3 s,
// then one every 20 s, until they start or mage ends.
func sayCompiling(marker string, done <-chan struct{}) {
	start := time.Now()
	next := 3 * time.Second
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		if _, err := os.Stat(marker); err != nil {
			return
		}
		if waited := time.Since(start); waited >= next {
			if next == 3*time.Second {
				fmt.Fprintln(os.Stderr, "kiln: compiling the mage targets (after kiln or the magefile changed; about a minute on a fresh machine)")
			} else {
				fmt.Fprintf(os.Stderr, "kiln: still compiling the mage targets (%s)\n", waited.Round(time.Second))
			}
			next += 20 * time.Second
		}
	}
}

// debugEnv, set to 1, makes kiln-mage say whether mage runs and why.
const debugEnv = "KILN_MAGE_DEBUG"

func debugf(format string, args ...any) {
	if os.Getenv(debugEnv) == "1" {
		fmt.Fprintf(os.Stderr, "kiln-mage: "+format+"\n", args...)
	}
}

// waitOnly leaves Ctrl-C to the child, which gets it through the terminal's
// process group and decides the exit code. Caught, not ignored: an ignored
// signal would stay ignored in the child and in what it starts. The
// targets are not exec'd in this process's place: go tool passes every
// signal on to this process, and a second Ctrl-C makes the targets quit
// without cleaning up (1 time in 5 here).
func waitOnly() {
	signal.Notify(make(chan os.Signal, 1), os.Interrupt, syscall.SIGTERM)
}

// runTargets runs the targets binary mage built last, as mage runs it: in
// the repository root, with the arguments and environment mage would give.
// It returns only when the binary could not start, saying why.
func runTargets(exe string, args []string) string {
	cmd := exec.Command(exe, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	gocmd := os.Getenv("MAGEFILE_GOCMD")
	if gocmd == "" {
		gocmd = "go"
	}
	cmd.Env = append(os.Environ(), "MAGEFILE_GOCMD="+gocmd)
	// go tool puts its go's folder first on PATH for mage: so does this, so
	// the targets (and kiln's no-op check, which reads the environment) see
	// the same either way.
	if gobin, err := exec.LookPath("go"); err == nil {
		cmd.Env = append(cmd.Env, "PATH="+filepath.Dir(gobin)+string(os.PathListSeparator)+os.Getenv("PATH"))
	}
	waitOnly()
	if err := cmd.Start(); err != nil {
		return "the recorded targets did not start: " + err.Error()
	}
	exit(cmd.Wait())
	return ""
}

// stampPath is the record of the checkout at root in mage's cache folder, ""
// when there is none to use.
func stampPath(root string) string {
	dir := os.Getenv("MAGEFILE_CACHE")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		dir = filepath.Join(home, ".magefile")
	}
	sum := sha256.Sum256([]byte(root))
	return filepath.Join(dir, "kiln-targets-"+hex.EncodeToString(sum[:8])+".json")
}

// upToDate returns the targets binary the stamp names when the stamp was
// written for fingerprint and the binary is still the one mage built then;
// otherwise why not.
func upToDate(stamp, fingerprint string) (string, string) {
	// The record names a binary to run: only one in mage's own cache folder,
	// and only when no other user could have written the record, the
	// binary or the folder.
	cache, err := filepath.EvalSymlinks(filepath.Dir(stamp))
	if err != nil {
		return "", "no cache folder: " + err.Error()
	}
	if _, err := os.Lstat(stamp); errors.Is(err, fs.ErrNotExist) {
		return "", "no record of the targets' last start yet"
	}
	for _, path := range []string{cache, stamp} {
		if why := notOurs(path); why != "" {
			return "", why
		}
	}
	data, err := os.ReadFile(stamp)
	if err != nil {
		return "", err.Error()
	}
	var rec magerun.Record
	if json.Unmarshal(data, &rec) != nil || filepath.Dir(rec.Exe) != cache {
		return "", stamp + " is not a record of the targets'"
	}
	if rec.Fingerprint != fingerprint {
		return "", "what the targets are built from changed since they last started"
	}
	if why := notOurs(rec.Exe); why != "" {
		return "", why
	}
	if info, err := os.Stat(rec.Exe); err != nil || !rec.Matches(info) {
		return "", "the targets binary changed since it last started"
	}
	return rec.Exe, ""
}

// notOurs says why path is not to be trusted: not a regular file or
// folder of the current user's, or writable by others.
func notOurs(path string) string {
	info, err := os.Lstat(path)
	switch {
	case err != nil:
		return err.Error()
	case !info.Mode().IsRegular() && !info.IsDir():
		return path + " is not a regular file"
	case info.Mode().Perm()&0o022 != 0:
		return path + " is writable by others"
	}
	if uid, ok := magerun.StatField(info, "Uid"); ok && uid != int64(os.Getuid()) {
		return path + " belongs to another user"
	}
	return ""
}

// inputsFingerprint digests what mage's build of the targets reads: the
// go version, the environment that steers go, and the name, size, times
// and mode of every file in magefiles/ and in the folders its go.mod replaces
// modules with. Modules from the module cache are named by go.mod and
// go.sum, which are among those files. "" and why when it cannot tell: a
// go.work, or a file GOFLAGS names, could change the build unseen.
func inputsFingerprint() (string, string) {
	h := sha256.New()
	// The version makes a record of an older kiln's never trusted.
	fmt.Fprintf(h, "kiln-mage 3\ngo %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if work := os.Getenv("GOWORK"); work != "" && work != "off" {
		return "", "GOWORK is set"
	}
	for _, flag := range strings.Fields(os.Getenv("GOFLAGS")) {
		for _, names := range []string{"-modfile", "--modfile", "-overlay", "--overlay", "-pgo", "--pgo"} {
			if strings.HasPrefix(flag, names+"=") {
				return "", "GOFLAGS names a file (" + flag + ")"
			}
		}
	}
	// Settings of go env -w steer the build as the variables do.
	goenv := os.Getenv("GOENV")
	if config, err := os.UserConfigDir(); goenv == "" && err == nil {
		goenv = filepath.Join(config, "go", "env")
	}
	if goenv != "" && goenv != "off" {
		data, _ := os.ReadFile(goenv)
		fmt.Fprintf(h, "goenv %q %x\n", goenv, sha256.Sum256(data))
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		steers := strings.HasPrefix(name, "GO") || strings.HasPrefix(name, "CGO_") || strings.HasPrefix(name, "MAGEFILE_") ||
			name == "PATH" || name == "HOME" || name == "XDG_CONFIG_HOME" || name == "CC" || name == "CXX" || name == "PKG_CONFIG"
		return !steers
	})
	slices.Sort(env)
	for _, kv := range env {
		fmt.Fprintf(h, "env %s\n", kv)
	}
	// The folders themselves, not symbolic links to them: a walk does not
	// follow a link it starts from.
	magefiles, err := filepath.EvalSymlinks("magefiles")
	if err == nil {
		magefiles, err = filepath.Abs(magefiles)
	}
	if err != nil {
		return "", err.Error()
	}
	for dir := magefiles; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return "", "a go.work could change the build"
		}
		if filepath.Dir(dir) == dir {
			break
		}
	}
	dirs, err := replacedDirs(magefiles)
	if err != nil {
		return "", "magefiles/go.mod: " + err.Error()
	}
	// A file changed within the clock tick of this walk could change again
	// unseen: nothing is vouched for until its times are 2 s old.
	start, latest := time.Now(), int64(0)
	for _, dir := range append([]string{magefiles}, dirs...) {
		if dir, err = filepath.EvalSymlinks(dir); err != nil {
			return "", "magefiles/go.mod: " + err.Error()
		}
		fmt.Fprintf(h, "dir %s\n", dir)
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			name := d.Name()
			if d.IsDir() && path != dir && (name == ".git" || name == "_output") {
				return filepath.SkipDir
			}
			if name == "mage_output_file.go" { // mage writes it while it compiles
				return nil
			}
			if d.IsDir() { // its time changes with that file; its files say what changed
				fmt.Fprintf(h, "%q/\n", path)
				return nil
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			changed := changeTime(info)
			fmt.Fprintf(h, "%q %d %d %d %o\n", path, info.Size(), info.ModTime().UnixNano(), changed, info.Mode())
			latest = max(latest, info.ModTime().UnixNano(), changed)
			return nil
		})
		if err != nil {
			return "", err.Error()
		}
	}
	if start.Sub(time.Unix(0, latest)) < 2*time.Second {
		return "", "a file changed less than 2 s ago (or has a time ahead of the clock)"
	}
	return hex.EncodeToString(h.Sum(nil)), ""
}

// changeTime is the file's status change time, 0 where the system gives
// none. Unlike its modification time, no program can set it back, so a
// rewrite that keeps size and time still shows.
func changeTime(info fs.FileInfo) int64 {
	for _, name := range []string{"Ctim", "Ctimespec"} {
		if sec, ok := magerun.StatField(info, name, "Sec"); ok {
			nsec, _ := magerun.StatField(info, name, "Nsec")
			return sec*1e9 + nsec
		}
	}
	return 0
}

// replacedDirs are the local folders that magefiles/go.mod replaces
// modules with, absolute.
func replacedDirs(magefiles string) ([]string, error) {
	f, err := os.Open(filepath.Join(magefiles, "go.mod"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var dirs []string
	inBlock := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "//")
		line = strings.TrimSpace(line)
		switch {
		case line == "replace (":
			inBlock = true
			continue
		case inBlock && line == ")":
			inBlock = false
			continue
		case strings.HasPrefix(line, "replace "):
			line = strings.TrimPrefix(line, "replace ")
		case !inBlock:
			continue
		}
		_, target, ok := strings.Cut(line, "=>")
		if !ok {
			continue
		}
		path := strings.Fields(target + " x")[0]
		if strings.ContainsAny(path, "\"`") {
			return nil, fmt.Errorf("a quoted replacement path (%s): not read here", path)
		}
		if strings.HasPrefix(path, "./") || strings.HasPrefix(path, "../") || filepath.IsAbs(path) || path == "." || path == ".." {
			if !filepath.IsAbs(path) {
				path = filepath.Join(magefiles, path)
			}
			dirs = append(dirs, filepath.Clean(path))
		}
	}
	return dirs, sc.Err()
}
