package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/golang"
	"github.com/kiln-build/kiln/internal/plan"
)

// planView is the plan as `mage plan` shows it.
type planView struct {
	*plan.Plan
	BuildPlatform string              `json:"buildPlatform"`
	Platforms     []string            `json:"platforms"`
	CompileEnv    map[string][]string `json:"compileEnv"`
}

func view(p *plan.Plan) planView {
	v := planView{Plan: p, BuildPlatform: config.FormatPlatform(p.BuildPlatform), Platforms: p.PlatformIDs(), CompileEnv: map[string][]string{}}
	for _, target := range p.Platforms {
		v.CompileEnv[config.FormatPlatform(target)] = golang.Env(p, target)
	}
	return v
}

// WritePlanJSON writes the plan for machines.
func WritePlanJSON(w io.Writer, p *plan.Plan) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(view(p))
}

// WritePlanText writes the plan for people.
func WritePlanText(w io.Writer, p *plan.Plan) {
	v := view(p)
	fmt.Fprintf(w, "module      %s\n", p.Module)
	fmt.Fprintf(w, "toolchain   go%s (golang.org/toolchain@%s sha256:%s)\n", p.Toolchain.GoVersion, p.Toolchain.Module, p.Toolchain.SHA256)
	fmt.Fprintf(w, "build on    %s (cross-compiling, no emulation)\n", v.BuildPlatform)
	fmt.Fprintf(w, "platforms   %s\n", strings.Join(v.Platforms, ", "))
	fmt.Fprintf(w, "stamp       version=%s commit=%s tree=%s release=%t\n", p.Stamp.Version, p.Stamp.Commit, p.Stamp.TreeState, p.Stamp.Release)
	fmt.Fprintf(w, "source date %d (%s)\n", p.SourceDateEpoch, p.Created().Format("2006-01-02T15:04:05Z"))
	fmt.Fprintf(w, "cache ids   GOCACHE=%s GOMODCACHE=%s\n", p.Cache.GoCache, p.Cache.GoModCache)
	fmt.Fprintf(w, "module mode -mod=%s (%s)\n", p.ModMode, p.ModModeFrom)
	switch {
	case p.ModMode == plan.ModVendor:
		fmt.Fprintf(w, "modules     from vendor/ (no download step)\n")
	case len(p.Modules) == 0:
		fmt.Fprintf(w, "modules     none beyond the standard library (no download step)\n")
	default:
		fmt.Fprintf(w, "modules     %s\n", strings.Join(p.Modules, " "))
	}
	fmt.Fprintf(w, "\nGo environment (every binary; only GOOS/GOARCH/GOARM differ):\n")
	fmt.Fprintf(w, "  env   %s\n", strings.Join(p.GoEnv.Env, " "))
	fmt.Fprintf(w, "  flags %s\n", strings.Join(p.GoEnv.BuildArgs, " "))
	fmt.Fprintf(w, "\nbinaries:\n")
	for _, b := range p.Binaries {
		fmt.Fprintf(w, "  %-18s %-24s %-28s %d source files\n", b.Name, b.Package, b.Module, len(b.Files))
	}
	fmt.Fprintf(w, "\nimages:\n")
	for _, img := range p.Images {
		fmt.Fprintf(w, "  %-18s %s  [%s]  user %s\n", img.Name, img.Ref, strings.Join(img.Binaries, ", "), img.User)
	}
}
