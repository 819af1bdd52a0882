package inspect

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"
)

// Difference is one place where two builds of the same commit differ.
type Difference struct {
	Image    string `json:"image"`
	Platform string `json:"platform,omitempty"`
	// Where is index, manifest, config, layer or file.
	Where  string `json:"where"`
	Path   string `json:"path,omitempty"`
	Detail string `json:"detail"`
}

func (d Difference) String() string {
	parts := []string{d.Image}
	if d.Platform != "" {
		parts = append(parts, d.Platform)
	}
	parts = append(parts, d.Where)
	if d.Path != "" {
		parts = append(parts, d.Path)
	}
	return strings.Join(parts, " ") + ": " + d.Detail
}

// DiffLayouts compares two exports of one image, from the index down to the
// bytes of each file and, for binaries, to the ELF sections that differ.
func DiffLayouts(image string, a, b *Layout) []Difference {
	if a.IndexDigest == b.IndexDigest {
		return nil
	}
	out := []Difference{{Image: image, Where: "index", Detail: fmt.Sprintf("digest %s, then %s", a.IndexDigest, b.IndexDigest)}}
	return append(out, diffManifests(image, a.Manifests, b)...)
}

// DiffPlatforms compares only these platforms' manifests of a and b: the
// index of a build of fewer platforms is another index.
func DiffPlatforms(image string, a, b *Layout, platforms []string) []Difference {
	var manifests []Manifest
	for _, m := range a.Manifests {
		if slices.Contains(platforms, m.Platform) {
			manifests = append(manifests, m)
		}
	}
	var out []Difference
	for _, p := range platforms {
		if !slices.ContainsFunc(a.Manifests, func(m Manifest) bool { return m.Platform == p }) {
			out = append(out, Difference{Image: image, Platform: p, Where: "index", Detail: "platform missing from the first build"})
		}
	}
	return append(out, diffManifests(image, manifests, b)...)
}

// diffManifests compares each of manifests with b's of the same platform.
func diffManifests(image string, manifests []Manifest, b *Layout) []Difference {
	var out []Difference
	add := func(d Difference) { d.Image = image; out = append(out, d) }
	byPlatform := map[string]*Manifest{}
	for i := range b.Manifests {
		byPlatform[b.Manifests[i].Platform] = &b.Manifests[i]
	}
	for i := range manifests {
		ma := &manifests[i]
		mb, ok := byPlatform[ma.Platform]
		if !ok {
			add(Difference{Platform: ma.Platform, Where: "index", Detail: "platform missing from the second build"})
			continue
		}
		if ma.Digest == mb.Digest {
			continue
		}
		add(Difference{Platform: ma.Platform, Where: "manifest", Detail: fmt.Sprintf("digest %s, then %s", ma.Digest, mb.Digest)})
		if ma.Manifest.Config.Digest != mb.Manifest.Config.Digest {
			for _, d := range diffJSON(ma.ConfigRaw, mb.ConfigRaw) {
				add(Difference{Platform: ma.Platform, Where: "config", Path: d.path, Detail: d.detail})
			}
		}
		if len(ma.Layers) != len(mb.Layers) {
			add(Difference{Platform: ma.Platform, Where: "layer", Detail: fmt.Sprintf("%d layers, then %d", len(ma.Layers), len(mb.Layers))})
			continue
		}
		for li := range ma.Layers {
			la, lb := ma.Layers[li], mb.Layers[li]
			if la.Digest == lb.Digest {
				continue
			}
			add(Difference{Platform: ma.Platform, Where: "layer", Path: fmt.Sprintf("#%d", li), Detail: fmt.Sprintf("digest %s, then %s", la.Digest, lb.Digest)})
			for _, d := range diffFiles(la.Files, lb.Files) {
				d.Platform = ma.Platform
				add(d)
			}
		}
	}
	return out
}

func diffFiles(a, b []File) []Difference {
	var out []Difference
	bf := map[string]File{}
	for _, f := range b {
		bf[f.Path] = f
	}
	seen := map[string]bool{}
	for _, fa := range a {
		seen[fa.Path] = true
		fb, ok := bf[fa.Path]
		if !ok {
			out = append(out, Difference{Where: "file", Path: "/" + fa.Path, Detail: "missing from the second build"})
			continue
		}
		var diffs []string
		if fa.Size != fb.Size {
			diffs = append(diffs, fmt.Sprintf("size %d, then %d", fa.Size, fb.Size))
		}
		if fa.Mode != fb.Mode {
			diffs = append(diffs, fmt.Sprintf("mode %o, then %o", fa.Mode, fb.Mode))
		}
		if fa.UID != fb.UID || fa.GID != fb.GID {
			diffs = append(diffs, fmt.Sprintf("owner %d:%d, then %d:%d", fa.UID, fa.GID, fb.UID, fb.GID))
		}
		if !fa.ModTime.Equal(fb.ModTime) {
			diffs = append(diffs, fmt.Sprintf("mtime %s, then %s", fa.ModTime.UTC().Format(time.RFC3339), fb.ModTime.UTC().Format(time.RFC3339)))
		}
		if fa.SHA256 != fb.SHA256 {
			diffs = append(diffs, fmt.Sprintf("content sha256 %.12s, then %.12s", fa.SHA256, fb.SHA256))
			if sections := elfSectionDiff(fa.Data, fb.Data); len(sections) > 0 {
				diffs = append(diffs, "ELF sections differ: "+strings.Join(sections, ", "))
			}
		}
		if len(diffs) > 0 {
			out = append(out, Difference{Where: "file", Path: "/" + fa.Path, Detail: strings.Join(diffs, "; ")})
		}
	}
	for _, fb := range b {
		if !seen[fb.Path] {
			out = append(out, Difference{Where: "file", Path: "/" + fb.Path, Detail: "only in the second build"})
		}
	}
	return out
}

// elfSectionDiff names the sections whose bytes differ between two ELF files.
func elfSectionDiff(a, b []byte) []string {
	fa, err := elf.NewFile(bytes.NewReader(a))
	if err != nil {
		return nil
	}
	fb, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return nil
	}
	sums := func(f *elf.File) map[string]string {
		m := map[string]string{}
		for _, s := range f.Sections {
			if s.Type == elf.SHT_NOBITS || s.Name == "" {
				continue
			}
			h := sha256.New()
			io.Copy(h, s.Open())
			m[s.Name] = fmt.Sprintf("%d:%s", s.Size, hex.EncodeToString(h.Sum(nil)))
		}
		return m
	}
	sa, sb := sums(fa), sums(fb)
	var out []string
	for _, name := range slices.Sorted(maps.Keys(sa)) {
		if sa[name] != sb[name] {
			out = append(out, name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(sb)) {
		if _, ok := sa[name]; !ok {
			out = append(out, name+" (only in the second)")
		}
	}
	return out
}

type jsonDiff struct{ path, detail string }

// diffJSON lists the leaves of two JSON documents that differ.
func diffJSON(a, b []byte) []jsonDiff {
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return []jsonDiff{{detail: "not JSON"}}
	}
	fa, fb := map[string]any{}, map[string]any{}
	flatten("", va, fa)
	flatten("", vb, fb)
	var out []jsonDiff
	for _, k := range slices.Sorted(maps.Keys(fa)) {
		if !reflect.DeepEqual(fa[k], fb[k]) {
			out = append(out, jsonDiff{path: k, detail: fmt.Sprintf("%v, then %v", fa[k], fb[k])})
		}
	}
	for _, k := range slices.Sorted(maps.Keys(fb)) {
		if _, ok := fa[k]; !ok {
			out = append(out, jsonDiff{path: k, detail: fmt.Sprintf("only in the second build: %v", fb[k])})
		}
	}
	return out
}

func flatten(prefix string, v any, into map[string]any) {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			flatten(prefix+"."+k, x, into)
		}
	case []any:
		for i, x := range t {
			flatten(fmt.Sprintf("%s[%d]", prefix, i), x, into)
		}
	default:
		into[strings.TrimPrefix(prefix, ".")] = v
	}
}
