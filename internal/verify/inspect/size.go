package inspect

import (
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/kiln-build/kiln/internal/config"
)

// Contributor is a module or package and the bytes its symbols take.
type Contributor struct {
	Name  string `json:"name"`
	Bytes int64  `json:"bytes"`
	// Delta is the change against the previous report.
	Delta int64 `json:"delta"`
}

// SizeEntry is the size breakdown of one binary for one platform.
type SizeEntry struct {
	Binary   string `json:"binary"`
	Platform string `json:"platform"`
	// Size is the file as shipped (stripped).
	Size  int64 `json:"size"`
	Delta int64 `json:"delta"`
	// Attributed is the part of Size that symbols account for; the rest is
	// headers, tables and padding.
	Attributed int64         `json:"attributed"`
	Modules    []Contributor `json:"modules"`
	Packages   []Contributor `json:"packages"`
	Budget     int64         `json:"budget,omitempty"`
}

// SizeReport is what `mage size` writes.
type SizeReport struct {
	Entries []SizeEntry `json:"entries"`
	// HasPrevious says whether deltas were computed against an earlier report.
	HasPrevious bool `json:"hasPrevious"`
}

const keepPackages = 40

// Breakdown attributes a binary's bytes to modules and packages, using the
// symbol table of an unstripped build of the same inputs.
func Breakdown(binary, platform string, stripped, symbols []byte) (SizeEntry, error) {
	e := SizeEntry{Binary: binary, Platform: platform, Size: int64(len(stripped))}
	f, err := elf.NewFile(bytes.NewReader(symbols))
	if err != nil {
		return e, fmt.Errorf("%s %s: not an ELF file: %w", binary, platform, err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		return e, fmt.Errorf("%s %s: no symbol table (was it built without -s?): %w", binary, platform, err)
	}
	info, err := buildinfo.Read(bytes.NewReader(symbols))
	if err != nil {
		return e, fmt.Errorf("%s %s: no Go build info: %w", binary, platform, err)
	}
	modules := []string{info.Main.Path}
	for _, d := range info.Deps {
		modules = append(modules, d.Path)
	}
	// Longest module path first, so nested modules win.
	sort.Slice(modules, func(i, j int) bool { return len(modules[i]) > len(modules[j]) })

	byModule, byPackage := map[string]int64{}, map[string]int64{}
	for _, s := range syms {
		if s.Size == 0 || int(s.Section) >= len(f.Sections) || s.Section == elf.SHN_UNDEF {
			continue
		}
		if sec := f.Sections[s.Section]; sec.Type == elf.SHT_NOBITS || sec.Flags&elf.SHF_ALLOC == 0 {
			continue // takes no bytes in the file, or is not loaded
		}
		name := cleanSymbol(s.Name)
		pkg := symbolPackage(name, info.Path)
		mod := "std"
		for _, m := range modules {
			if strings.HasPrefix(pkg, m) && (len(pkg) == len(m) || pkg[len(m)] == '/' || pkg[len(m)] == '.') {
				mod = m
				break
			}
		}
		if strings.HasPrefix(pkg, "go:") {
			mod = "std"
		}
		byModule[mod] += int64(s.Size)
		byPackage[pkg] += int64(s.Size)
		e.Attributed += int64(s.Size)
	}
	e.Modules = sorted(byModule, 0)
	e.Packages = sorted(byPackage, keepPackages)
	return e, nil
}

// cleanSymbol strips the decorations around a Go symbol's qualified name.
func cleanSymbol(name string) string {
	for _, p := range []string{"type:.eq.", "type:.hash.", "type:", "go:itab.", "go:info.", "go:cuinfo."} {
		if strings.HasPrefix(name, p) {
			name = name[len(p):]
			break
		}
	}
	return strings.TrimLeft(name, "*[]0123456789")
}

// symbolPackage is the import path of a symbol's package; mainPath names
// the main package, which the linker calls "main".
func symbolPackage(name, mainPath string) string {
	if strings.HasPrefix(name, "go:") {
		return "go:runtime data"
	}
	end := len(name)
	if i := strings.IndexAny(name, "[("); i >= 0 {
		end = i
	}
	slash := strings.LastIndex(name[:end], "/")
	dot := strings.Index(name[slash+1:], ".")
	if dot < 0 {
		return "go:other"
	}
	pkg := name[:slash+1+dot]
	if pkg == "main" {
		return mainPath
	}
	return pkg
}

func sorted(m map[string]int64, limit int) []Contributor {
	out := make([]Contributor, 0, len(m))
	for k, v := range m {
		out = append(out, Contributor{Name: k, Bytes: v})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Bytes != out[j].Bytes {
			return out[i].Bytes > out[j].Bytes
		}
		return out[i].Name < out[j].Name
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out
}

// CompareTo fills in the deltas against a previous report.
func (r *SizeReport) CompareTo(prev *SizeReport) {
	if prev == nil {
		return
	}
	r.HasPrevious = true
	old := map[string]SizeEntry{}
	for _, e := range prev.Entries {
		old[e.Binary+" "+e.Platform] = e
	}
	for i := range r.Entries {
		e := &r.Entries[i]
		p, ok := old[e.Binary+" "+e.Platform]
		if !ok {
			continue
		}
		e.Delta = e.Size - p.Size
		delta(e.Modules, p.Modules)
		delta(e.Packages, p.Packages)
	}
}

func delta(now, before []Contributor) {
	old := map[string]int64{}
	for _, c := range before {
		old[c.Name] = c.Bytes
	}
	for i := range now {
		now[i].Delta = now[i].Bytes - old[now[i].Name]
	}
}

// Grown returns the contributors of an entry that grew most, or the largest
// ones when there is nothing to compare with.
func (e SizeEntry) Grown(n int) []Contributor { return grown(e.Packages, n) }

// GrownModules is Grown by module: the modules whose bytes grew most.
func (e SizeEntry) GrownModules(n int) []Contributor { return grown(e.Modules, n) }

func grown(contributors []Contributor, n int) []Contributor {
	var grown []Contributor
	for _, c := range contributors {
		if c.Delta > 0 {
			grown = append(grown, c)
		}
	}
	if len(grown) == 0 {
		grown = append(grown, contributors...)
	} else {
		sort.Slice(grown, func(i, j int) bool { return grown[i].Delta > grown[j].Delta })
	}
	if len(grown) > n {
		grown = grown[:n]
	}
	return grown
}

// WriteTable prints one row per binary and platform with its top modules.
func (r *SizeReport) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BINARY\tPLATFORM\tSIZE\tDELTA\tBUDGET\tLARGEST PACKAGES")
	for _, e := range r.Entries {
		var top []string
		for i, m := range e.Packages {
			if i == 3 {
				break
			}
			top = append(top, fmt.Sprintf("%s %s", m.Name, config.FormatSize(m.Bytes)))
		}
		d := "-"
		if r.HasPrevious {
			d = signed(e.Delta)
		}
		b := "-"
		if e.Budget > 0 {
			b = fmt.Sprintf("%s (%d%%)", config.FormatSize(e.Budget), e.Size*100/e.Budget)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", e.Binary, e.Platform, config.FormatSize(e.Size), d, b, strings.Join(top, ", "))
	}
	return tw.Flush()
}

func signed(n int64) string {
	if n > 0 {
		return "+" + config.FormatSize(n)
	}
	if n == 0 {
		return "0"
	}
	return config.FormatSize(n)
}
