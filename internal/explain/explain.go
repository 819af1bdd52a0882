// Package explain owns the cache report: it records what each build step
// depended on, and after a build tells which steps ran and which input
// change made each of them run.
package explain

import (
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/golang"
	"github.com/kiln-build/kiln/internal/image"
	"github.com/kiln-build/kiln/internal/plan"
	"github.com/kiln-build/kiln/internal/uptodate"
)

// Inputs maps a step name to its inputs, each a name and a digest.
type Inputs map[string]map[string]string

// Record is what one build leaves behind for the next one to compare with.
type Record struct {
	Inputs Inputs         `json:"inputs"`
	Steps  buildkit.Steps `json:"steps"`
}

// Collect computes the inputs of every compile and image step of a plan.
// The names match the vertex names the LLB stage gives those steps; defs maps
// those names to the digests of their LLB definitions and of the named steps
// they depend on, so a change in how kiln builds a step is named too.
// hashFile is the Digest of a file of the plan's root.
func Collect(p *plan.Plan, defs map[string]map[string]string, hashFile func(rel string) (string, error)) (Inputs, error) {
	in := Inputs{}
	hashes := map[string]string{}
	hash := func(rel string) (string, error) {
		if h, ok := hashes[rel]; ok {
			return h, nil
		}
		h, err := hashFile(rel)
		if err != nil {
			return "", err
		}
		hashes[rel] = h
		return h, nil
	}
	shared := map[string]string{
		"toolchain": p.Toolchain.SHA256[:12],
		"stamp":     Digest([]byte(strings.Join([]string{p.Stamp.Version, p.Stamp.Commit, p.Stamp.TreeState}, " "))),
		"flags":     Digest([]byte(strings.Join(append(append([]string{}, p.GoEnv.Env...), p.GoEnv.BuildArgs...), " "))),
		"modules":   Digest([]byte(strings.Join(p.Modules, " "))),
	}
	for _, target := range p.Platforms {
		plat := config.FormatPlatform(target)
		link := func(binary string) string { return golang.LinkStepName(binary, target) }
		all := map[string]string{"platform": plat}
		for _, b := range p.Binaries {
			step := map[string]string{"platform": plat}
			maps.Copy(step, shared)
			for _, f := range b.Files {
				h, err := hash(f)
				if err != nil {
					return nil, err
				}
				step["file "+f] = h
				all["file "+f] = h
			}
			in[link(b.Name)] = step
		}
		maps.Copy(all, shared)
		in[golang.PackageStepName(target)] = all
		for _, img := range p.Images {
			if !slices.ContainsFunc(img.Targets, func(t ocispec.Platform) bool { return config.FormatPlatform(t) == plat }) {
				continue
			}
			step := map[string]string{"created": fmt.Sprint(p.SourceDateEpoch)}
			cfg, _ := json.Marshal(img.Image)
			step["image.yaml"] = Digest(cfg)
			for _, f := range img.Files {
				if err := hashTree(p.Root, path.Join(img.Dir, f.Src), step); err != nil {
					return nil, err
				}
			}
			for _, b := range img.Binaries {
				step["binary "+b] = Digest([]byte(fmt.Sprint(in[link(b)])))
			}
			in[image.AssembleStepName(img.Name, target)] = step
		}
	}
	for name, step := range in {
		maps.Copy(step, defs[name])
	}
	return in, nil
}

// hashTree adds "file REL" inputs for a file, or for every file under a
// folder, of an image's files:.
func hashTree(root, rel string, into map[string]string) error {
	return filepath.WalkDir(filepath.Join(root, filepath.FromSlash(rel)), func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(name)
		if err != nil {
			return err
		}
		r, err := filepath.Rel(root, name)
		if err != nil {
			return err
		}
		into["file "+filepath.ToSlash(r)] = Digest(data)
		return nil
	})
}

// isPart is an input naming one step of a step's definition.
func isPart(input string) bool { return strings.HasPrefix(input, "definition of ") }

// Digest is how explain names the bytes of a file.
func Digest(data []byte) string { return uptodate.Digest(data) }

// Explanation is one step of a build with why it ran.
type Explanation struct {
	Step   string   `json:"step"`
	Ran    bool     `json:"ran"`
	Causes []string `json:"causes,omitempty"`
}

// Explain compares a build's record with the previous one.
func Explain(now Record, prev *Record) []Explanation {
	var out []Explanation
	for _, st := range now.Steps {
		inputs, tracked := now.Inputs[st.Name]
		if !tracked {
			continue
		}
		e := Explanation{Step: st.Name, Ran: !st.Cached}
		if e.Ran {
			e.Causes = causes(inputs, prev, st.Name)
		}
		out = append(out, e)
	}
	return out
}

func causes(now map[string]string, prev *Record, step string) []string {
	if prev == nil {
		return []string{"no earlier build recorded"}
	}
	before, ok := prev.Inputs[step]
	if !ok {
		return []string{"new step"}
	}
	// Records from before kiln named the steps a definition is made of
	// would otherwise list every one of them as added.
	partsRecorded := slices.ContainsFunc(slices.Collect(maps.Keys(before)), isPart)
	var out []string
	namedPart := false
	for _, k := range slices.Sorted(maps.Keys(now)) {
		old, had := before[k]
		switch {
		case !had && (partsRecorded || !isPart(k)):
			out = append(out, k+" added")
		case had && old != now[k]:
			out = append(out, k+" changed")
		default:
			continue
		}
		namedPart = namedPart || isPart(k)
	}
	for _, k := range slices.Sorted(maps.Keys(before)) {
		if _, ok := now[k]; !ok && (partsRecorded || !isPart(k)) {
			out = append(out, k+" removed")
			namedPart = namedPart || isPart(k)
		}
	}
	// A named step's own change explains the whole definition's.
	if namedPart {
		out = slices.DeleteFunc(out, func(c string) bool { return c == "step definition changed" })
	}
	if len(out) == 0 {
		return []string{"inputs unchanged: the daemon had no cached result (pruned, or another daemon)"}
	}
	return out
}

// Write prints the explanations: reused steps in one line, each step that
// ran with its causes.
func Write(w io.Writer, ex []Explanation) {
	reused := 0
	for _, e := range ex {
		if !e.Ran {
			reused++
		}
	}
	fmt.Fprintf(w, "%d of %d tracked steps reused\n", reused, len(ex))
	for _, e := range ex {
		if e.Ran {
			fmt.Fprintf(w, "ran  %s\n     because: %s\n", e.Step, strings.Join(e.Causes, ", "))
		}
	}
}
