package plan

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
)

// ModuleEnvKeys are the settings of the go command a build takes from the
// host: the module download step gets them, and GOFLAGS steers -mod.
var ModuleEnvKeys = []string{"GOPROXY", "GOPRIVATE", "GONOPROXY", "GONOSUMDB", "GOSUMDB", "GOINSECURE", "GOFLAGS"}

// listHostKeys are the host's settings the listings run with besides
// ModuleEnvKeys: where modules are and how they are fetched. The listings
// run with GOENV=off and these set as go env gives them, so that a
// `go env -w` of a setting that chooses files (GOAMD64, GOEXPERIMENT…)
// steers no listing: those come from kiln.yaml, as in the compile.
var listHostKeys = []string{"GOMODCACHE", "GOPATH", "GOVCS", "GOAUTH", "GOTOOLCHAIN"}

// Host is what kiln reads of the machine and the repository it builds,
// once, before the plan: no stage after it runs git or `go env`.
type Host struct {
	// GoEnv is `go env` of ModuleEnvKeys, settings of `go env -w`
	// included; GoEnvErr says why it could not be read (a build that
	// downloads modules fails with it; others do not need it).
	GoEnv    map[string]string
	GoEnvErr error
	// GoFlags is the caller's GOFLAGS variable.
	GoFlags string
	// Git is the repository's state.
	Git Git
}

// Git is a repository's head and, for a stamped build, its tree state and
// release version.
type Git struct {
	Commit string
	Time   int64
	// Err is set when there is no commit to read (no git, no repository).
	Err error
	// Stamped is set when Dirty and Version were read (release builds).
	Stamped    bool
	Dirty      bool
	DirtyErr   error
	Version    string
	VersionErr error
	// Tracked are the files git tracks, relative to the root (stamped
	// builds only; nil when git could not list them).
	Tracked map[string]bool
}

// Key is the head as it enters a no-op record's key.
func (g Git) Key() string { return fmt.Sprintf("%s %d %v", g.Commit, g.Time, g.Err != nil) }

// ReadGitHead reads the commit at root and its time.
func ReadGitHead(root string) Git {
	out, err := run(root, nil, "git", "log", "-1", "--format=%H %ct")
	if err != nil {
		return Git{Err: err}
	}
	fields := strings.Fields(out)
	if len(fields) != 2 {
		return Git{Err: fmt.Errorf("git log: unexpected output %q", out)}
	}
	t, err := strconv.ParseInt(fields[1], 10, 64)
	if err != nil {
		return Git{Err: fmt.Errorf("git log: unexpected output %q", out)}
	}
	return Git{Commit: fields[0], Time: t}
}

// ReadHost reads the host facts a build of root needs: head is the head
// read already (by a no-op check), nil to read it; stamp reads the tree
// state and version too. go env runs in the working directory, answered
// from the list cache in listCache when nothing it reads changed.
func ReadHost(root, listCache string, stamp bool, head *Git) *Host {
	h := &Host{}
	if head != nil {
		h.Git = *head
	} else {
		h.Git = ReadGitHead(root)
	}
	if stamp {
		h.Git.Stamped = true
		h.Git.Dirty, h.Git.DirtyErr = gitDirty(root)
		h.Git.Version, h.Git.VersionErr = gitDescribe(root)
		h.Git.Tracked = gitTracked(root)
	}
	h.GoEnv, h.GoEnvErr = readModuleEnv(listCache)
	h.GoFlags = os.Getenv("GOFLAGS")
	return h
}

func readModuleEnv(listCache string) (map[string]string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	out, err := ModuleEnv(listCache, wd, append(slices.Clone(ModuleEnvKeys), listHostKeys...)...)
	if err != nil {
		return nil, fmt.Errorf("read the Go module environment with `go env`: %w", err)
	}
	var env map[string]string
	if err := json.Unmarshal([]byte(out), &env); err != nil {
		return nil, fmt.Errorf("go env -json: %w", err)
	}
	return env, nil
}

// gitTracked lists the files git tracks under root, relative to it.
func gitTracked(root string) map[string]bool {
	out, err := run(root, nil, "git", "ls-files", "-z")
	if err != nil {
		return nil
	}
	tracked := map[string]bool{}
	for _, f := range strings.Split(out, "\x00") {
		if f != "" {
			tracked[f] = true
		}
	}
	return tracked
}

// ModuleEnvOf is `go env` of ModuleEnvKeys, read now (tests, and callers
// without a plan); listCache as for ReadHost.
func ModuleEnvOf(listCache string) (map[string]string, error) { return readModuleEnv(listCache) }

// listEnv is the host's part of a listing's environment: GOENV=off and the
// module settings as go env gave them; nil when go env could not be read
// (the listing then runs in the host's environment as it is).
func (h *Host) listEnv() []string {
	if h == nil || h.GoEnvErr != nil || h.GoEnv == nil {
		return nil
	}
	env := []string{"GOENV=off"}
	for _, k := range slices.Sorted(maps.Keys(h.GoEnv)) {
		if k != "GOFLAGS" && h.GoEnv[k] != "" {
			env = append(env, k+"="+h.GoEnv[k])
		}
	}
	return env
}

// goFlags is the caller's GOFLAGS variable, which chooses -mod (and
// -modcacherw) as in a go command run by hand; a `go env -w` GOFLAGS does
// not, so that a developer's machine and CI build alike.
func (h *Host) goFlags() string {
	if h != nil {
		return h.GoFlags
	}
	return os.Getenv("GOFLAGS")
}

// Host is the host facts the plan was resolved with.
func (p *Plan) Host() *Host { return p.host }
