//! The advisor on a synthetic day of traffic: three tenants on a free tier
//! of 100 requests a minute and one on a paid tier of 1,000, their usage
//! per minute over two hours (time moved by a `ManualClock`, so it runs in
//! a moment), then the advisor's report as a table and as an SVG of each
//! tenant's usage beside its current and suggested limit.
//!
//! ```text
//! cargo run --example advice -- --out docs/advice.svg
//! ```

use bytes::Bytes;
use clap::Parser;
use http::{Request, Response};
use http_body_util::Empty;
use plotters::prelude::*;
use std::convert::Infallible;
use std::time::Duration;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_ratelimit::clock::ManualClock;
use tower_ratelimit::key::Header;
use tower_ratelimit::rate::{Advice, Advisor};
use tower_ratelimit::{Policy, RateLimitLayer};

#[derive(Parser)]
struct Args {
    /// Where to write the SVG.
    #[arg(long, default_value = "advice.svg")]
    out: std::path::PathBuf,
    /// Minutes of traffic.
    #[arg(long, default_value_t = 120)]
    minutes: u64,
}

/// A tenant's requests in minute `m`: a base, a daily-ish swell, and spikes.
fn usage(tenant: &str, m: u64) -> u64 {
    let swell =
        |peak: f64| (peak * (std::f64::consts::PI * m as f64 / 120.0).sin().max(0.0)) as u64;
    match tenant {
        "acme" => 30 + swell(40.0) + if m.is_multiple_of(37) { 50 } else { 0 },
        "globex" => 60 + swell(30.0),
        "initech" => 5 + m % 7,
        "umbrella" => 400 + swell(300.0) + if m == 90 { 500 } else { 0 },
        _ => 0,
    }
}

const TENANTS: [&str; 4] = ["acme", "globex", "initech", "umbrella"];

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let minute = Duration::from_secs(60);
    let clock = ManualClock::new(1_700_000_040_000);
    let layer = RateLimitLayer::builder()
        .quota("100/1m".parse::<Policy>()?)
        .key(Header::try_new("x-tenant")?)
        .clock(clock.clone())
        .advisor(Advisor::new().window(minute).windows(args.minutes as usize))
        .build()?;
    layer.limits().set("umbrella", "1000/1m".parse()?).await?;
    let mut svc = layer
        .clone()
        .layer(service_fn(|_: Request<Empty<Bytes>>| async {
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        }));
    for m in 0..args.minutes {
        for tenant in TENANTS {
            for _ in 0..usage(tenant, m) {
                let req = Request::builder()
                    .header("x-tenant", tenant)
                    .body(Empty::new())?;
                svc.ready().await?.call(req).await?;
            }
        }
        clock.advance(minute);
    }
    let advice = layer.advice().ok_or("the layer has an advisor")?;
    print_table(&advice);
    plot(&advice, &args.out)?;
    println!("\nwrote {}", args.out.display());
    Ok(())
}

fn print_table(advice: &Advice) {
    println!(
        "{} windows of {:?}; suggested = p99 × 1.5, rounded up",
        advice.windows, advice.window
    );
    println!("\n| key | tier | peak | p99 | current | suggested |");
    println!("|---|---|---:|---:|---:|---:|");
    for k in &advice.keys {
        let name = k.text.as_deref().unwrap_or("(no text)");
        println!(
            "| {name} | {} | {} | {} | {} | {} |",
            k.tier, k.peak, k.percentile, k.current, k.suggested
        );
    }
    println!("\n| tier | keys | peak | p99 | current | suggested |");
    println!("|---|---:|---:|---:|---:|---:|");
    for t in &advice.tiers {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            t.tier, t.keys, t.peak, t.percentile, t.current, t.suggested
        );
    }
}

fn plot(advice: &Advice, out: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let keys = &advice.keys;
    let root = SVGBackend::new(out, (900, 260 * keys.len().max(1) as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    for (panel, k) in root.split_evenly((keys.len().max(1), 1)).iter().zip(keys) {
        let n = k.usage.len() as f64;
        let y_max = k
            .usage
            .iter()
            .copied()
            .chain([k.current, k.suggested])
            .max()
            .unwrap_or(1) as f64
            * 1.1;
        let name = k.text.as_deref().unwrap_or("(no text)");
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("{name} ({}): requests per minute", k.tier),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..n, 0f64..y_max)?;
        chart
            .configure_mesh()
            .x_desc("minute")
            .y_desc("requests")
            .draw()?;
        let points = k
            .usage
            .iter()
            .enumerate()
            .map(|(i, u)| (i as f64, *u as f64));
        chart
            .draw_series(LineSeries::new(points, BLUE.stroke_width(2)))?
            .label("usage")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE.stroke_width(2)));
        for (value, label, color) in [
            (k.current, "current limit", BLACK),
            (k.suggested, "suggested limit", RED),
        ] {
            chart
                .draw_series(LineSeries::new(
                    [(0.0, value as f64), (n, value as f64)],
                    color.stroke_width(2),
                ))?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()?;
    }
    root.present()?;
    Ok(())
}
