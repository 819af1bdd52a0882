// Package release owns what a release publishes besides images: the SBOM
// of each image (from its binaries' Go build info, as no scanner image is
// reachable) and the names and checksums of the release assets.
package image

import (
	"bytes"
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"
)

// SPDXPredicateType is the in-toto predicate type of an SPDX document.
const SPDXPredicateType = "https://spdx.dev/Document"

type spdxDoc struct {
	SPDXVersion       string             `json:"spdxVersion"`
	DataLicense       string             `json:"dataLicense"`
	SPDXID            string             `json:"SPDXID"`
	Name              string             `json:"name"`
	DocumentNamespace string             `json:"documentNamespace"`
	CreationInfo      spdxCreationInfo   `json:"creationInfo"`
	Packages          []spdxPackage      `json:"packages"`
	Relationships     []spdxRelationship `json:"relationships"`
}

type spdxCreationInfo struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type spdxPackage struct {
	SPDXID           string       `json:"SPDXID"`
	Name             string       `json:"name"`
	VersionInfo      string       `json:"versionInfo,omitempty"`
	DownloadLocation string       `json:"downloadLocation"`
	FilesAnalyzed    bool         `json:"filesAnalyzed"`
	ExternalRefs     []spdxExtRef `json:"externalRefs,omitempty"`
	Comment          string       `json:"comment,omitempty"`
}

type spdxExtRef struct {
	ReferenceCategory string `json:"referenceCategory"`
	ReferenceType     string `json:"referenceType"`
	ReferenceLocator  string `json:"referenceLocator"`
}

type spdxRelationship struct {
	Element string `json:"spdxElementId"`
	Type    string `json:"relationshipType"`
	Related string `json:"relatedSpdxElement"`
}

// SBOM describes the binaries of one image for one platform: each binary,
// its Go version and every module its build info lists. created is the
// source date, so the document is reproducible.
func SBOM(image, platform, version string, created time.Time, binaries map[string][]byte) ([]byte, error) {
	doc := spdxDoc{
		SPDXVersion: "SPDX-2.3", DataLicense: "CC0-1.0", SPDXID: "SPDXRef-DOCUMENT",
		Name:              fmt.Sprintf("%s %s %s", image, platform, version),
		DocumentNamespace: fmt.Sprintf("https://spdx.kiln.invalid/%s/%s/%s", image, strings.ReplaceAll(platform, "/", "-"), version),
		CreationInfo:      spdxCreationInfo{Created: created.UTC().Format(time.RFC3339), Creators: []string{"Tool: kiln"}},
	}
	seen := map[string]bool{}
	add := func(p spdxPackage) {
		if !seen[p.SPDXID] {
			seen[p.SPDXID] = true
			doc.Packages = append(doc.Packages, p)
		}
	}
	names := make([]string, 0, len(binaries))
	for n := range binaries {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		info, err := buildinfo.Read(bytes.NewReader(binaries[name]))
		if err != nil {
			return nil, fmt.Errorf("SBOM of %s (%s): %s has no Go build info: %w", image, platform, name, err)
		}
		binID := "SPDXRef-Binary-" + spdxID(name)
		add(spdxPackage{SPDXID: binID, Name: name, VersionInfo: version, DownloadLocation: "NOASSERTION",
			Comment: "built by " + info.GoVersion + " from " + info.Path})
		doc.Relationships = append(doc.Relationships, spdxRelationship{"SPDXRef-DOCUMENT", "DESCRIBES", binID})
		std := "SPDXRef-Package-stdlib-" + spdxID(info.GoVersion)
		add(spdxPackage{SPDXID: std, Name: "stdlib", VersionInfo: info.GoVersion, DownloadLocation: "https://go.dev/dl/",
			ExternalRefs: []spdxExtRef{{"PACKAGE-MANAGER", "purl", "pkg:golang/stdlib@" + info.GoVersion}}})
		doc.Relationships = append(doc.Relationships, spdxRelationship{binID, "DEPENDS_ON", std})
		mods := append([]*debugModule{{info.Main.Path, info.Main.Version}}, depsOf(info)...)
		for _, m := range mods {
			id := "SPDXRef-Package-" + spdxID(m.path+"@"+m.version)
			add(spdxPackage{SPDXID: id, Name: m.path, VersionInfo: m.version, DownloadLocation: "NOASSERTION",
				ExternalRefs: []spdxExtRef{{"PACKAGE-MANAGER", "purl", fmt.Sprintf("pkg:golang/%s@%s", m.path, m.version)}}})
			doc.Relationships = append(doc.Relationships, spdxRelationship{binID, "DEPENDS_ON", id})
		}
	}
	return json.MarshalIndent(doc, "", "  ")
}

type debugModule struct{ path, version string }

func depsOf(info *buildinfo.BuildInfo) []*debugModule {
	var out []*debugModule
	for _, d := range info.Deps {
		if d.Replace != nil {
			d = d.Replace
		}
		out = append(out, &debugModule{d.Path, d.Version})
	}
	return out
}

// spdxID keeps the characters SPDX ids allow.
func spdxID(s string) string {
	// Injective: "-" becomes "--" and any other character SPDX ids do not
	// allow becomes "-" and its hex code, so a/b and a-b stay apart.
	var b strings.Builder
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.':
			b.WriteRune(r)
		case r == '-':
			b.WriteString("--")
		default:
			fmt.Fprintf(&b, "-%x-", r)
		}
	}
	return b.String()
}

// Asset is one release file.
type Asset struct {
	Binary   string `json:"binary"`
	Platform string `json:"platform"`
	Name     string `json:"name"`
	SHA256   string `json:"sha256,omitempty"`
}

// Assets are the release files as Antrea ships them: antctl for every
// desktop and server platform, the agent and CNI plugin for Windows nodes.
func Assets() []Asset {
	type pair struct{ bin, platform string }
	var out []Asset
	for _, p := range []pair{
		{"antctl", "linux/amd64"}, {"antctl", "linux/arm64"}, {"antctl", "linux/arm/v7"},
		{"antctl", "darwin/amd64"}, {"antctl", "darwin/arm64"},
		{"antctl", "windows/amd64"}, {"antctl", "windows/arm64"},
		{"antrea-agent", "windows/amd64"}, {"antrea-cni", "windows/amd64"},
	} {
		out = append(out, Asset{Binary: p.bin, Platform: p.platform, Name: assetName(p.bin, p.platform)})
	}
	return out
}

func assetName(bin, platform string) string {
	parts := strings.Split(platform, "/")
	arch := map[string]string{"amd64": "x86_64", "arm64": "arm64", "arm": "arm"}[parts[1]]
	name := fmt.Sprintf("%s-%s-%s", bin, parts[0], arch)
	if parts[0] == "windows" {
		name += ".exe"
	}
	return name
}
