package audit

import "io"

// SARIF 2.1.0, the subset code-scanning services read: one run, the rules
// as reportingDescriptors, one result per finding.

const sarifSchema = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"

type sarifLog struct {
	Schema  string     `json:"$schema"`
	Version string     `json:"version"`
	Runs    []sarifRun `json:"runs"`
}

type sarifRun struct {
	Tool        sarifTool         `json:"tool"`
	Invocations []sarifInvocation `json:"invocations"`
	ColumnKind  string            `json:"columnKind"`
	Results     []sarifResult     `json:"results"`
}

// sarifInvocation carries the skipped files as notifications, where
// SARIF puts what a tool has to say about its own run.
type sarifInvocation struct {
	ExecutionSuccessful        bool                `json:"executionSuccessful"`
	ToolExecutionNotifications []sarifNotification `json:"toolExecutionNotifications"`
}

type sarifNotification struct {
	Level     string          `json:"level"`
	Message   sarifText       `json:"message"`
	Locations []sarifLocation `json:"locations"`
}

type sarifTool struct {
	Driver sarifDriver `json:"driver"`
}

type sarifDriver struct {
	Name           string      `json:"name"`
	InformationURI string      `json:"informationUri,omitempty"`
	Rules          []sarifRule `json:"rules"`
}

type sarifText struct {
	Text string `json:"text"`
}

type sarifRule struct {
	ID                   string         `json:"id"`
	ShortDescription     sarifText      `json:"shortDescription"`
	FullDescription      sarifText      `json:"fullDescription"`
	Help                 sarifText      `json:"help"`
	DefaultConfiguration sarifConfig    `json:"defaultConfiguration"`
	Properties           map[string]any `json:"properties,omitempty"`
}

type sarifConfig struct {
	Level string `json:"level"`
}

type sarifResult struct {
	RuleID    string          `json:"ruleId"`
	RuleIndex int             `json:"ruleIndex"`
	Level     string          `json:"level"`
	Message   sarifText       `json:"message"`
	Locations []sarifLocation `json:"locations"`
}

type sarifLocation struct {
	PhysicalLocation sarifPhysical `json:"physicalLocation"`
}

type sarifPhysical struct {
	ArtifactLocation sarifArtifact `json:"artifactLocation"`
	Region           *sarifRegion  `json:"region,omitempty"`
}

type sarifArtifact struct {
	URI string `json:"uri"`
}

type sarifRegion struct {
	StartLine   int `json:"startLine"`
	StartColumn int `json:"startColumn"`
}

func (r *Report) writeSARIF(w io.Writer) error {
	rules := r.RulesUsed()
	index := map[string]int{}
	driver := sarifDriver{Name: "weightcache audit", Rules: make([]sarifRule, 0, len(rules))}
	for i, rule := range rules {
		index[rule.ID] = i
		sr := sarifRule{
			ID:                   rule.ID,
			ShortDescription:     sarifText{rule.Message},
			FullDescription:      sarifText{"Source: " + rule.Source},
			Help:                 sarifText{rule.Fix},
			DefaultConfiguration: sarifConfig{rule.sev.String()},
		}
		if rule.Release != "" {
			sr.Properties = map[string]any{"release": rule.Release}
		}
		driver.Rules = append(driver.Rules, sr)
	}
	results := make([]sarifResult, 0, len(r.Findings))
	for _, f := range r.Findings {
		results = append(results, sarifResult{
			RuleID:    f.Rule,
			RuleIndex: index[f.Rule],
			Level:     f.Severity.String(),
			Message:   sarifText{f.Message + ". Fix: " + f.Fix},
			Locations: []sarifLocation{{PhysicalLocation: sarifPhysical{
				ArtifactLocation: sarifArtifact{URI: artifactURI(f.Path)},
				Region:           &sarifRegion{StartLine: f.Line, StartColumn: f.Column},
			}}},
		})
	}
	inv := sarifInvocation{ExecutionSuccessful: true, ToolExecutionNotifications: make([]sarifNotification, 0, len(r.Skipped))}
	for _, s := range r.Skipped {
		inv.ToolExecutionNotifications = append(inv.ToolExecutionNotifications, sarifNotification{
			Level:     "note",
			Message:   sarifText{"skipped: " + s.Reason},
			Locations: []sarifLocation{{PhysicalLocation: sarifPhysical{ArtifactLocation: sarifArtifact{URI: artifactURI(s.Path)}}}},
		})
	}
	return encode(w, sarifLog{
		Schema:  sarifSchema,
		Version: "2.1.0",
		Runs: []sarifRun{{Tool: sarifTool{Driver: driver}, Invocations: []sarifInvocation{inv},
			ColumnKind: "unicodeCodePoints", Results: results}},
	})
}
