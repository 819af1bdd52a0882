// Package inspect reads what a build produced (OCI layouts, ELF binaries)
// and judges it: static linking, image contents, size breakdowns and
// budgets, differences between two builds, and the reports of those
// checks. It builds nothing; package verify runs the builds it checks.
package inspect

import (
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"fmt"
	"sort"
	"strings"
)

// StaticResult is the static-link check of one binary.
type StaticResult struct {
	Binary   string   `json:"binary"`
	Platform string   `json:"platform"`
	OK       bool     `json:"ok"`
	Problems []string `json:"problems,omitempty"`
}

// Static checks that an ELF binary is statically linked and was built the
// kiln way: no interpreter, no needed libraries, no undefined dynamic
// symbols, and build info saying CGO_ENABLED=0 and -trimpath.
func Static(binary, platform string, data []byte) StaticResult {
	r := StaticResult{Binary: binary, Platform: platform}
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		r.Problems = append(r.Problems, fmt.Sprintf("not an ELF file: %v", err))
		return r
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			interp := make([]byte, p.Filesz)
			p.ReadAt(interp, 0)
			r.Problems = append(r.Problems, fmt.Sprintf("has an ELF interpreter %s (dynamically linked)", strings.TrimRight(string(interp), "\x00")))
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		r.Problems = append(r.Problems, "needs shared libraries: "+strings.Join(libs, ", "))
	}
	if syms, err := f.DynamicSymbols(); err == nil {
		var undefined []string
		for _, s := range syms {
			if s.Section == elf.SHN_UNDEF && s.Name != "" {
				undefined = append(undefined, s.Name)
			}
		}
		if len(undefined) > 0 {
			sort.Strings(undefined)
			r.Problems = append(r.Problems, fmt.Sprintf("%d undefined dynamic symbols: %s", len(undefined), strings.Join(undefined, ", ")))
		}
	}
	info, err := buildinfo.Read(bytes.NewReader(data))
	if err != nil {
		r.Problems = append(r.Problems, fmt.Sprintf("no Go build info: %v", err))
	} else {
		settings := map[string]string{}
		for _, s := range info.Settings {
			settings[s.Key] = s.Value
		}
		if settings["CGO_ENABLED"] != "0" {
			r.Problems = append(r.Problems, fmt.Sprintf("built with CGO_ENABLED=%q, want 0", settings["CGO_ENABLED"]))
		}
		if settings["-trimpath"] != "true" {
			r.Problems = append(r.Problems, "built without -trimpath")
		}
	}
	r.OK = len(r.Problems) == 0
	return r
}
