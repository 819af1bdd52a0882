package plan

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/kiln-build/kiln/internal/config"
)

// Module modes kiln passes to go as -mod.
const (
	ModVendor   = "vendor"
	ModReadonly = "readonly"
	ModMod      = "mod"
)

// resolveModules finds the main modules (one, or a go.work workspace's),
// the files module resolution reads, and the module mode.
func (p *Plan) resolveModules(cfg *config.Config) error {
	_, statErr := os.Stat(filepath.Join(p.Root, "go.work"))
	p.Workspace = statErr == nil && os.Getenv("GOWORK") != "off"
	if !p.Workspace && !exists(filepath.Join(p.Root, "go.mod")) {
		return fmt.Errorf("%s: no go.mod or go.work there; kiln builds a Go module or workspace from its root", p.Root)
	}
	mode, from, err := modMode(p.Root, cfg, p.Workspace, p.host.goFlags())
	if err != nil {
		return err
	}
	p.ModMode, p.ModModeFrom = mode, from

	out, err := p.lists.run(&p.Reads, p.Root, p.listEnv(), p.moduleDeps, "list", "-m", "-json=Path,Dir,Main")
	if err != nil {
		return fmt.Errorf("read the main modules: %w%s", err, Hint(err.Error()))
	}
	var paths []string
	p.ModFiles = []string{"go.mod", "go.sum"}
	if p.Workspace {
		p.ModFiles = []string{"go.work", "go.work.sum"}
	}
	dec := json.NewDecoder(strings.NewReader(out))
	for {
		var m listedModule
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return fmt.Errorf("read the main modules: %w", err)
		}
		paths = append(paths, m.Path)
		if !p.Workspace {
			continue
		}
		rel, ok := within(p.Root, m.Dir)
		if !ok {
			return fmt.Errorf("%s: uses %s, which is outside %s; BuildKit sees only the repository, so move the module under it", filepath.Join(p.Root, "go.work"), m.Dir, p.Root)
		}
		p.ModFiles = append(p.ModFiles, filepath.ToSlash(filepath.Join(rel, "go.mod")), filepath.ToSlash(filepath.Join(rel, "go.sum")))
	}
	if len(paths) == 0 {
		return fmt.Errorf("%s: go list -m found no main module", p.Root)
	}
	var present []string
	p.ModFileHashes = map[string]string{}
	for _, f := range p.ModFiles {
		data, err := os.ReadFile(filepath.Join(p.Root, f))
		if errors.Is(err, os.ErrNotExist) {
			continue
		} else if err != nil {
			return err
		}
		present = append(present, f)
		p.ModFileHashes[f] = fmt.Sprintf("%x", sha256.Sum256(data))
	}
	p.ModFiles = present
	p.Module = paths[0]
	if p.Workspace {
		p.Module = "workspace " + strings.Join(paths, ", ")
	}
	return nil
}

// moduleDeps are what go list -m reads: the module files at the root and
// each main module's go.mod.
func (p *Plan) moduleDeps(out string) (dirs, files []string) {
	for _, f := range []string{"go.mod", "go.sum", "go.work", "go.work.sum", "vendor/modules.txt"} {
		files = append(files, filepath.Join(p.Root, f))
	}
	dec := json.NewDecoder(strings.NewReader(out))
	for {
		var m listedModule
		if dec.Decode(&m) != nil {
			break
		}
		if m.Dir != "" {
			files = append(files, filepath.Join(m.Dir, "go.mod"))
		}
	}
	// A go.work or vendor/modules.txt that appears changes the answer.
	dirs = []string{p.Root}
	if vendor := filepath.Join(p.Root, "vendor"); exists(vendor) {
		dirs = append(dirs, vendor)
	}
	return dirs, existing(files)
}

// existing keeps the files that exist: a missing one is an input only
// through the directory listing of its folder.
func existing(files []string) []string {
	return slices.DeleteFunc(slices.Clone(files), func(f string) bool { return !exists(f) })
}

// listEnv is the environment of the host-side go list runs: the host's
// module settings, the build's module mode and GOFLAGS and the variables
// that choose files (as the compile has them, from kiln.yaml's go.env),
// and the workspace only when the build uses it.
func (p *Plan) listEnv() []string {
	gowork := "off"
	if p.Workspace {
		gowork = filepath.Join(p.Root, "go.work")
	}
	flags := "-mod=" + p.ModMode
	if v := WithoutModFlag(p.goEnvConfig["GOFLAGS"]); v != "" {
		flags = v + " " + flags
	}
	if slices.Contains(strings.Fields(p.host.goFlags()), "-modcacherw") {
		flags += " -modcacherw"
	}
	env := p.host.listEnv()
	for _, k := range config.BuildEnvKeys {
		env = append(env, k+"="+p.goEnvConfig[k])
	}
	// go's own index of package folders trusts a folder while its files'
	// names, sizes and modification times are the same, so an import
	// edited with the file's size and time kept (cp -p) would be listed
	// as it was. kiln's list cache, which also reads the change time,
	// runs go list only when something changed: then go reads the files.
	godebug := "goindex=0"
	if host := os.Getenv("GODEBUG"); host != "" {
		godebug = host + "," + godebug
	}
	env = append(env, "GOWORK="+gowork, "GOFLAGS="+flags, "GODEBUG="+godebug)
	if p.lists.gocmd != "" {
		// The pinned go lists as it is, with its own GOROOT, whatever the
		// caller has (a go that switched toolchains sets GOROOT for what it
		// runs, mage and kiln among them) or `go env -w` wrote.
		goroot := filepath.Dir(filepath.Dir(p.lists.gocmd))
		env = append(env, LocalToolchain, "GOROOT="+goroot)
	}
	return env
}

// modMode chooses go's -mod the way go itself would: an explicit -mod in the
// caller's GOFLAGS, then in build/kiln.yaml's go.env.GOFLAGS, then vendor
// when vendor/modules.txt exists, else readonly.
func modMode(root string, cfg *config.Config, workspace bool, goflags string) (mode, from string, err error) {
	for _, src := range []struct{ name, flags string }{
		{"GOFLAGS", goflags},
		{config.File + ": go.env.GOFLAGS", cfg.Go.Env["GOFLAGS"]},
	} {
		if m := modFlag(src.flags); m != "" {
			mode, from = m, src.name+" has -mod="+m
			break
		}
	}
	vendored := exists(filepath.Join(root, "vendor", "modules.txt"))
	switch mode {
	case "":
		if vendored {
			return ModVendor, "vendor/modules.txt is present", nil
		}
		return ModReadonly, "default", nil
	case ModVendor:
		if !vendored {
			return "", "", fmt.Errorf("%s, but %s does not exist: run `go mod vendor` (or `go work vendor`), or drop -mod=vendor", from, filepath.Join(root, "vendor", "modules.txt"))
		}
	case ModReadonly:
	case ModMod:
		if workspace {
			return "", "", fmt.Errorf("%s, which go refuses in workspace mode (go.work): use -mod=readonly, or GOWORK=off", from)
		}
	default:
		return "", "", fmt.Errorf("%s: go knows -mod=vendor, -mod=readonly and -mod=mod only", from)
	}
	return mode, from, nil
}

// modFlag is the value of the last -mod flag in a GOFLAGS string.
func modFlag(goflags string) string {
	mode := ""
	for _, f := range strings.Fields(goflags) {
		if v, ok := strings.CutPrefix(strings.TrimLeft(f, "-"), "mod="); ok {
			mode = v
		}
	}
	return mode
}

// WithoutModFlag drops -mod flags: the module mode is the plan's to set.
func WithoutModFlag(goflags string) string {
	var kept []string
	for _, f := range strings.Fields(goflags) {
		if !strings.HasPrefix(strings.TrimLeft(f, "-"), "mod=") {
			kept = append(kept, f)
		}
	}
	return strings.Join(kept, " ")
}

var (
	refusedRE  = regexp.MustCompile(`(?m)(\S+)@(\S+): (?:reading|verifying module: \S+: reading) (\S+?): (403 Forbidden|404 Not Found|410 Gone)`)
	mismatchRE = regexp.MustCompile(`(?m)verifying (\S+?)(?:/go\.mod)?@(\S+?)(?:/go\.mod)?: checksum mismatch`)
	missingRE  = regexp.MustCompile(`(?m)missing go\.sum entry for (?:module providing package |go\.mod file; to add it:\s+go mod download )?(\S+)`)
)

// Hint turns go's module errors into the remedy a user needs, or "" when
// the output holds none of them. It is shared by the plan (host go list)
// and the download step.
func Hint(output string) string {
	if m := refusedRE.FindStringSubmatch(output); m != nil {
		proxy := m[3]
		if i := strings.Index(proxy, "/"+m[1]+"/@v/"); i > 0 {
			proxy = proxy[:i]
		}
		return fmt.Sprintf("\nmodule %s@%s: the proxy %s refused it (%s). If it is private, list it in GOPRIVATE (fetched directly, with your git credentials); otherwise serve it from a file:// GOPROXY directory, or vendor it with `go mod vendor`.", m[1], m[2], RedactURL(proxy), m[4])
	}
	if m := mismatchRE.FindStringSubmatch(output); m != nil {
		return fmt.Sprintf("\nmodule %s@%s: its content does not match go.sum (checksum mismatch). The proxy serves other bytes than the ones recorded: check the proxy, or if the new content is right, remove its go.sum lines and run `go mod tidy`.", m[1], m[2])
	}
	if strings.Contains(output, "inconsistent vendoring") {
		return "\nvendor/modules.txt does not match go.mod: run `go mod vendor` to sync the vendor directory, or build without it with GOFLAGS=-mod=readonly."
	}
	if m := missingRE.FindStringSubmatch(output); m != nil {
		return fmt.Sprintf("\ngo.sum lacks the lines for %s: run `go mod tidy` and commit go.sum.", strings.TrimSuffix(m[1], ";"))
	}
	return ""
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// within returns dir relative to root when dir is root or inside it.
func within(root, dir string) (string, bool) {
	rel, err := filepath.Rel(root, dir)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", false
	}
	return rel, true
}
