"""The bundled document tasks: each builder draws its figures from ``random.Random`` seeded
with ``f"{SEED}/{task_id}"`` (so a task changes only when its own builder does), prints
them, and returns the ground truth computed from the same integers.

Amounts are drawn as integers in the smallest unit a document prints (thousands, or tenths
of a million) and turned into ``Decimal`` for the truth, so nothing is lost to floats.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable
from decimal import Decimal as D
from typing import Any

from service.docgen.fmt import (
    date_abbr_us,
    date_dd_mon_yyyy,
    date_dmy_dots,
    date_long,
    date_mdy_slash,
    date_us,
    date_weekday,
    num,
    pct,
    q,
)
from service.docgen.pdf import Block, Doc, Footnotes, Heading, PageBreak, Para, Spacer, Table
from service.docgen.spec import (
    Line,
    TaskSpec,
    cover,
    currency,
    date,
    money,
    number,
    percent,
    statement,
    text,
)

#: The corpus seed: every figure of every task derives from it.
SEED = 20240617

#: Fields the instruction alone makes guessable (``guessable: true`` in the ground truth:
#: they earn credit only in proportion to the task's other fields; see
#: ``service.verifiers.document``). A field belongs here when its value follows from what
#: the instruction states (a country it names, a currency its answer forms name, a period or
#: year it gives) plus common knowledge, or from a prior alone (the largest economies, for a
#: text field), without reading the documents; ANLS partial credit counts.
#: ``tests/unit/test_document_guessable.py`` guesses every field from the instruction alone
#: and fails when a guess earns credit on a field not listed here.
GUESSABLE: dict[str, tuple[str, ...]] = {
    # a 2023 annual report: the calendar year end is the default guess
    "annual-report-income-statement": ("fiscal_year_end",),
    # "a Dutch group", amounts "in millions of euros"; the Dutch statutory rate is public
    "effective-tax-rate": ("statutory_tax_rate", "reporting_currency"),
    # "a Canadian company", amounts "in thousands of Canadian dollars"
    "free-cash-flow-definition": ("reporting_currency",),
    # "third-quarter interim report", "q3_2024": the quarter's last day
    "interim-report-dates": ("period_end_date",),
    # comparatives for "the year ended 31 March 2023" in the 2024 report
    "restated-comparatives": ("financial_year_end",),
    # "VAT", amounts "in euros": 21 % is the commonest euro-area standard rate (a trial)
    "invoice-line-items": ("vat_rate",),
    # one of the table's countries, and a prior ("the largest economy in Europe") is right
    "revenue-by-country-across-pages": ("largest_market_2023",),
    # "Northgate Schweiz AG"; the instruction names four subsidiaries (ANLS partial credit)
    "subsidiaries-multi-currency": (
        "swiss_functional_currency",
        "largest_subsidiary_by_usd_revenue",
    ),
}


def rng_for(task_id: str) -> random.Random:
    """The random source of one task (string seeds are hashed with SHA-512: stable)."""
    return random.Random(f"{SEED}/{task_id}")


def _part(r: random.Random, total: int, lo: int, hi: int) -> int:
    """``total * u / 1000`` for a random per-mille ``u`` in [lo, hi] (integer arithmetic)."""
    return total * r.randint(lo, hi) // 1000


def _m1(tenths: int) -> D:
    """Tenths of a million as millions (``12345`` -> 1234.5)."""
    return D(tenths) / 10


def _k_to_m(thousands: int) -> D:
    """Thousands as millions (``1284372`` -> 1284.372)."""
    return D(thousands) / 1000


# --------------------------------------------------------------------------- 1


def annual_report_income_statement() -> TaskSpec:
    """US annual report; statement in thousands, answers in millions; a net loss."""
    tid = "annual-report-income-statement"
    r = rng_for(tid)
    company = "Kestrel Robotics Inc."
    fy = dt.date(2023, 12, 31)
    prod = {2023: r.randint(880_000, 1_050_000)}
    serv = {2023: r.randint(260_000, 380_000)}
    prod[2022] = prod[2023] * 1000 // r.randint(1040, 1090)
    serv[2022] = serv[2023] * 1000 // r.randint(1080, 1160)
    lines: dict[str, dict[int, int]] = {}
    for y in (2023, 2022):
        rev = prod[y] + serv[y]
        cor = _part(r, rev, 560, 600)
        rnd = _part(r, rev, 140, 165)
        sga = _part(r, rev, 185, 205)
        restr = r.randint(18_000, 30_000) if y == 2023 else 0
        impair = r.randint(25_000, 45_000) if y == 2023 else 0
        interest = -r.randint(21_000, 27_000)
        other = r.randint(-3_000, 4_000)
        pbt = rev - cor - rnd - sga - restr - impair + interest + other
        if y == 2023 and pbt > -5_000:
            impair += pbt + r.randint(8_000, 20_000)
            pbt = rev - cor - rnd - sga - restr - impair + interest + other
        tax = (-pbt * r.randint(150, 220) // 1000) if pbt < 0 else -(_part(r, pbt, 190, 240))
        basic = r.randint(28_000, 34_000)
        net = pbt + tax
        diluted = basic if net < 0 else basic + r.randint(300, 900)
        lines[y] = dict(
            prod=prod[y],
            serv=serv[y],
            rev=rev,
            cor=cor,
            gp=rev - cor,
            rnd=rnd,
            sga=sga,
            restr=restr,
            impair=impair,
            opex=rnd + sga + restr + impair,
            op=rev - cor - rnd - sga - restr - impair,
            interest=interest,
            other=other,
            pbt=pbt,
            tax=tax,
            net=net,
            basic=basic,
            diluted=diluted,
        )
    a, b = lines[2023], lines[2022]
    eps = {
        y: (
            q(D(lines[y]["net"]) / lines[y]["basic"], 2),
            q(D(lines[y]["net"]) / lines[y]["diluted"], 2),
        )
        for y in lines
    }

    def row(label: str, key: str, **kw: Any) -> Line:
        return Line(label, (a[key], b[key]), **kw)

    table = statement(
        ["2023", "2022"],
        [
            Line("Revenue:"),
            row("Product", "prod", indent=1),
            row("Services", "serv", indent=1),
            row("Total revenue", "rev", bold=True, rule=True),
            row("Cost of revenue", "cor"),
            row("Gross profit", "gp", bold=True, rule=True),
            Line("Operating expenses:"),
            row("Research and development", "rnd", indent=1),
            row("Selling, general and administrative", "sga", indent=1),
            row("Restructuring charges", "restr", indent=1),
            row("Impairment of goodwill", "impair", indent=1),
            row("Total operating expenses", "opex", rule=True),
            row("Operating income (loss)", "op", bold=True),
            row("Interest expense", "interest"),
            row("Other income (expense), net", "other"),
            row("Income (loss) before income taxes", "pbt", rule=True),
            row("Income tax (expense) benefit", "tax"),
            row("Net income (loss)", "net", bold=True, rule=True),
            Line("Net income (loss) per share:"),
            Line("Basic", (num(eps[2023][0], 2), num(eps[2022][0], 2)), indent=1),
            Line("Diluted", (num(eps[2023][1], 2), num(eps[2022][1], 2)), indent=1),
            Line("Weighted-average shares outstanding:"),
            row("Basic", "basic", indent=1),
            row("Diluted", "diluted", indent=1),
        ],
        header_label="Year ended December 31,",
    )
    growth = q((D(a["rev"]) / b["rev"] - 1) * 100, 0)
    blocks = [
        *cover(company, "Annual Report 2023", f"For the fiscal year ended {date_us(fy)}"),
        Heading("Letter to our shareholders"),
        Para(
            f"2023 was a year of transition for {company.removesuffix('.')}. Revenue grew "
            f"{growth}% to "
            f"${q(_k_to_m(a['rev']) / 1000, 2)} billion, led by our warehouse automation "
            "platform, while we took decisive action to simplify our cost base. Those actions, "
            "together with the impairment of goodwill in our legacy consumer business, led to "
            f"a net loss of approximately ${q(-_k_to_m(a['net']), 0)} million for the year."
        ),
        Para(
            "We enter 2024 with a leaner organization, a record order backlog and a clear "
            "path to sustained profitability. Thank you for your continued support."
        ),
        Para("Dana Whitfield, Chief Executive Officer", "note"),
        PageBreak(),
        Heading("Consolidated Statements of Operations"),
        Para("(In thousands of U.S. dollars, except per share amounts)", "note"),
        table,
        Para(
            "The accompanying notes are an integral part of these consolidated financial "
            "statements.",
            "small",
        ),
    ]
    doc = Doc(
        title=f"{company} Annual Report 2023",
        author=company,
        running_header=f"{company} | Annual Report 2023",
        blocks=blocks,
    )
    net_m = _k_to_m(a["net"])
    return TaskSpec(
        id=tid,
        title="Figures from a US annual report, in millions",
        difficulty="easy",
        tags=("pdf", "income-statement", "scale"),
        intro=(
            "`/app/annual_report_2023.pdf` is the 2023 annual report of a listed company. "
            "Read the consolidated statements of operations and report the figures below."
        ),
        documents={"annual_report_2023.pdf": doc},
        answers=(
            text(
                "company_name",
                "The company's name, as printed on the cover",
                company,
                aliases=["Kestrel Robotics, Inc."],
            ),
            date(
                "fiscal_year_end",
                "The last day of the fiscal year the report covers",
                fy,
                evidence=[date_us(fy)],
            ),
            money(
                "total_revenue_2023",
                "Total revenue for 2023",
                _k_to_m(a["rev"]),
                currency="USD",
                scale="millions",
                tol="0.05",
                evidence=[num(a["rev"])],
                hint="at least one decimal",
            ),
            money(
                "net_income_2023",
                "Net income (loss) for 2023; a loss is negative",
                net_m,
                currency="USD",
                scale="millions",
                tol="0.05",
                evidence=[num(a["net"])],
                oracle=f"\u2212{-net_m}",
                hint="at least one decimal",
            ),
            money(
                "diluted_eps_2023",
                "Diluted net income (loss) per share for 2023; a loss is negative",
                eps[2023][1],
                currency="USD",
                scale="units",
                tol="0.001",
                evidence=[num(eps[2023][1], 2)],
                oracle=f"$({abs(eps[2023][1])})",
            ),
        ),
    )


# --------------------------------------------------------------------------- 2


def effective_tax_rate() -> TaskSpec:
    """Dutch N.V. in EUR millions; the 2023 effective tax rate must be computed."""
    tid = "effective-tax-rate"
    r = rng_for(tid)
    company = "Vantor Logistics N.V."
    stat_rate = D("25.8")
    y: dict[int, dict[str, int]] = {}
    for year in (2023, 2022):
        rev = (
            r.randint(38_000, 52_000)
            if year == 2023
            else y[2023]["rev"] * 1000 // r.randint(1020, 1080)
        )
        cos = _part(r, rev, 640, 690)
        dist = _part(r, rev, 90, 110)
        adm = _part(r, rev, 60, 75)
        oth = r.randint(50, 400)
        op = rev - cos - dist - adm + oth
        fin_inc = r.randint(50, 200)
        fin_cost = r.randint(600, 1_200)
        assoc = r.randint(80, 300)
        pbt = op + fin_inc - fin_cost + assoc
        at_stat = int(q(D(pbt) * stat_rate / 100, 0))
        foreign = r.randint(-250, 150)
        nondeduct = r.randint(40, 160)
        exempt = -int(q(D(assoc) * stat_rate / 100, 0))
        prior = r.randint(-60, 60)
        other = r.randint(-30, 30)
        tax = at_stat + foreign + nondeduct + exempt + prior + other
        y[year] = dict(
            rev=rev,
            cos=-cos,
            gp=rev - cos,
            dist=-dist,
            adm=-adm,
            oth=oth,
            op=op,
            fin_inc=fin_inc,
            fin_cost=-fin_cost,
            assoc=assoc,
            pbt=pbt,
            tax=-tax,
            net=pbt - tax,
            at_stat=at_stat,
            foreign=foreign,
            nondeduct=nondeduct,
            exempt=exempt,
            prior=prior,
            other=other,
            tax_pos=tax,
        )
    a, b = y[2023], y[2022]

    def row(label: str, key: str, note: str = "", **kw: Any) -> Line:
        return Line(label, (note, _m1(a[key]), _m1(b[key])), **kw)

    pl = statement(
        ["Note", "2023", "2022"],
        [
            row("Revenue", "rev", "4", bold=True),
            row("Cost of sales", "cos"),
            row("Gross profit", "gp", bold=True, rule=True),
            row("Distribution costs", "dist"),
            row("Administrative expenses", "adm"),
            row("Other operating income", "oth", "6"),
            row("Operating profit", "op", bold=True, rule=True),
            row("Finance income", "fin_inc", "8"),
            row("Finance costs", "fin_cost", "8"),
            row("Share of profit of associates", "assoc", "15"),
            row("Profit before income tax", "pbt", bold=True, rule=True),
            row("Income tax expense", "tax", "9"),
            row("Profit for the year", "net", bold=True, rule=True),
        ],
        decimals=1,
        label_width=0.5,
    )
    recon = statement(
        ["2023", "2022"],
        [
            Line("Profit before income tax", (_m1(a["pbt"]), _m1(b["pbt"]))),
            Line(
                f"Income tax at the Dutch statutory rate of {stat_rate}%",
                (_m1(a["at_stat"]), _m1(b["at_stat"])),
                rule=True,
            ),
            Line(
                "Effect of tax rates in foreign jurisdictions",
                (_m1(a["foreign"]), _m1(b["foreign"])),
            ),
            Line("Non-deductible expenses", (_m1(a["nondeduct"]), _m1(b["nondeduct"]))),
            Line(
                "Participation exemption on results of associates",
                (_m1(a["exempt"]), _m1(b["exempt"])),
            ),
            Line("Adjustments in respect of prior years", (_m1(a["prior"]), _m1(b["prior"]))),
            Line("Other", (_m1(a["other"]), _m1(b["other"]))),
            Line(
                "Income tax expense",
                (_m1(a["tax_pos"]), _m1(b["tax_pos"])),
                bold=True,
                rule=True,
            ),
        ],
        decimals=1,
        label_width=0.6,
    )
    etr_prior = q(D(b["tax_pos"]) / b["pbt"] * 100, 1)
    blocks = [
        *cover(company, "Annual Report 2023", "Rotterdam, the Netherlands"),
        Heading("Consolidated statement of profit or loss"),
        Para("For the year ended 31 December 2023 (in millions of euros)", "note"),
        pl,
        PageBreak(),
        Heading("Notes to the consolidated financial statements"),
        Heading("9. Income taxes", 2),
        Para(
            "The Group is subject to corporate income tax in the Netherlands at the statutory "
            f"rate of {stat_rate}% (2022: {stat_rate}%). Subsidiaries abroad are taxed at the "
            "rates that apply in their jurisdictions. Results of associates are exempt under "
            f"the Dutch participation exemption. The effective tax rate for 2022 was "
            f"{etr_prior}%."
        ),
        Para("Reconciliation of the statutory and the effective income tax:", "body"),
        recon,
        Para("All amounts in millions of euros.", "small"),
    ]
    doc = Doc(
        title=f"{company} Annual Report 2023",
        author=company,
        running_header=f"{company} | Annual Report 2023",
        blocks=blocks,
    )
    etr = q(D(a["tax_pos"]) / a["pbt"] * 100, 4)
    return TaskSpec(
        id=tid,
        title="Effective tax rate from a profit-or-loss statement",
        difficulty="medium",
        tags=("pdf", "tax", "ratio"),
        intro=(
            "`/app/annual_report_2023.pdf` contains the consolidated statement of profit or "
            "loss of a Dutch group and its income-tax note. Report the figures below for the "
            "year 2023."
        ),
        documents={"annual_report_2023.pdf": doc},
        answers=(
            money(
                "profit_before_tax_2023",
                "Profit before income tax for 2023",
                _m1(a["pbt"]),
                currency="EUR",
                scale="millions",
                tol="0.05",
                evidence=[num(_m1(a["pbt"]), 1)],
            ),
            money(
                "income_tax_expense_2023",
                "Income tax expense for 2023, as a positive number",
                _m1(a["tax_pos"]),
                currency="EUR",
                scale="millions",
                tol="0.05",
                evidence=[num(_m1(a["tax_pos"]), 1)],
                oracle=f"EUR {_m1(a['tax_pos'])} million",
            ),
            percent(
                "effective_tax_rate_2023",
                "The effective tax rate for 2023 (income tax expense / profit before income tax)",
                etr,
                tol="0.06",
                evidence=[],
                hint="one decimal is enough",
            ),
            percent(
                "statutory_tax_rate",
                "The Dutch statutory corporate income tax rate the group applies",
                stat_rate,
                tol="0",
                evidence=[f"{stat_rate}%"],
            ),
            currency(
                "reporting_currency",
                "The currency the statements are presented in",
                "EUR",
                evidence=["millions of euros"],
            ),
        ),
    )


# --------------------------------------------------------------------------- 3


def restated_comparatives() -> TaskSpec:
    """UK plc in £'000; the prior year is restated and a footnote gives the original."""
    tid = "restated-comparatives"
    r = rng_for(tid)
    company = "Aldermoor Textiles plc"
    division = "Northern Yarns"
    fye = dt.date(2024, 3, 31)
    rev24 = r.randint(150_000, 190_000)
    rev23 = rev24 * 1000 // r.randint(1030, 1080)
    disc_rev23 = r.randint(21_000, 34_000)
    disc_op23 = r.randint(1_200, 3_800)
    y: dict[int, dict[str, int]] = {}
    for year, rev in ((2024, rev24), (2023, rev23)):
        cos = _part(r, rev, 620, 660)
        dist = _part(r, rev, 80, 100)
        adm = _part(r, rev, 120, 140)
        op = rev - cos - dist - adm
        fin = r.randint(2_000, 3_500)
        pbt = op - fin
        tax = _part(r, pbt, 240, 260)
        cont = pbt - tax
        disc = -r.randint(2_000, 6_000) if year == 2024 else disc_op23 - disc_op23 // 4
        y[year] = dict(
            rev=rev,
            cos=-cos,
            gp=rev - cos,
            dist=-dist,
            adm=-adm,
            op=op,
            fin=-fin,
            pbt=pbt,
            tax=-tax,
            cont=cont,
            disc=disc,
            net=cont + disc,
        )
    a, b = y[2024], y[2023]
    orig_rev, orig_op = b["rev"] + disc_rev23, b["op"] + disc_op23

    def row(label: str, key: str, **kw: Any) -> Line:
        return Line(label, (a[key], b[key]), **kw)

    table = statement(
        ["2024\n£'000", "2023\nrestated*\n£'000"],
        [
            Line("Continuing operations"),
            row("Revenue", "rev", bold=True),
            row("Cost of sales", "cos"),
            row("Gross profit", "gp", rule=True),
            row("Distribution costs", "dist"),
            row("Administrative expenses", "adm"),
            row("Operating profit", "op", bold=True, rule=True),
            row("Finance costs", "fin"),
            row("Profit before taxation", "pbt", rule=True),
            row("Taxation", "tax"),
            row("Profit from continuing operations", "cont", rule=True),
            Line("Discontinued operations"),
            row("Profit/(loss) from discontinued operations", "disc"),
            row("Profit for the year", "net", bold=True, rule=True),
        ],
        header_label="",
    )
    foot = (
        f"* Restated. The comparative figures for the year ended 31 March 2023 have been "
        f"restated to present the {division} division, sold on 30 November 2023, as a "
        f"discontinued operation (note 11). As originally reported, revenue for the year ended "
        f"31 March 2023 was £{num(orig_rev * 1000)} and operating profit was "
        f"£{num(orig_op * 1000)}."
    )
    blocks = [
        *cover(company, "Annual Report and Accounts", f"For the year ended {date_long(fye)}"),
        Heading("Consolidated income statement"),
        Para(f"For the year ended {date_long(fye)}", "note"),
        table,
        Footnotes([foot]),
        Spacer(12),
        Heading("11. Discontinued operations", 2),
        Para(
            f"On 30 November 2023 the Group completed the sale of its {division} division to a "
            "private buyer. The division's results are presented as discontinued operations, "
            "and the comparative income statement has been restated accordingly. The loss on "
            "disposal is included in the loss from discontinued operations for 2024."
        ),
    ]
    doc = Doc(
        title=f"{company} Annual Report and Accounts 2024",
        author=company,
        running_header=f"{company} | Annual Report and Accounts 2024",
        blocks=blocks,
    )
    return TaskSpec(
        id=tid,
        title="Restated comparatives and the figures originally reported",
        difficulty="medium",
        tags=("pdf", "restatement", "footnote"),
        intro=(
            "`/app/annual_report_2024.pdf` contains a UK group's consolidated income statement. "
            "Its comparative year has been restated. Report the figures below."
        ),
        documents={"annual_report_2024.pdf": doc},
        answers=(
            money(
                "revenue_2023_restated",
                "Revenue for the year ended 31 March 2023, as restated in this report",
                D(b["rev"]),
                currency="GBP",
                scale="thousands",
                tol="0.5",
                evidence=[num(b["rev"])],
            ),
            money(
                "revenue_2023_as_originally_reported",
                "Revenue for the year ended 31 March 2023 as originally reported",
                D(orig_rev),
                currency="GBP",
                scale="thousands",
                tol="0.5",
                evidence=[num(orig_rev * 1000)],
                oracle=f"£{_k_to_m(orig_rev)} million",
            ),
            money(
                "restatement_revenue_difference",
                "By how much the restatement reduced 2023 revenue (originally reported minus "
                "restated, a positive number)",
                D(disc_rev23),
                currency="GBP",
                scale="thousands",
                tol="0.5",
                evidence=[],
            ),
            money(
                "operating_profit_2023_restated",
                "Operating profit for the year ended 31 March 2023, as restated",
                D(b["op"]),
                currency="GBP",
                scale="thousands",
                tol="0.5",
                evidence=[num(b["op"])],
            ),
            text(
                "discontinued_division",
                "The name of the division presented as a discontinued operation",
                division,
                aliases=[f"{division} division"],
            ),
            date(
                "financial_year_end",
                "The end date of the financial year this report covers",
                fye,
                evidence=[date_long(fye)],
            ),
        ),
    )


# --------------------------------------------------------------------------- 4


def footnote_adjusted_ebit() -> TaskSpec:
    """Swiss AG key figures in CHF millions; a footnote's one-off gain changes EBIT."""
    tid = "footnote-adjusted-ebit"
    r = rng_for(tid)
    company = "Calder Instruments AG"
    business = "Thermal Coatings"
    sales = {2023: r.randint(24_000, 31_000)}
    sales[2022] = sales[2023] * 1000 // r.randint(1020, 1070)
    gain = r.randint(400, 900)
    underlying = _part(r, sales[2023], 115, 135)
    ebit = {2023: underlying + gain, 2022: _part(r, sales[2022], 110, 130)}
    ebitda = {yr: ebit[yr] + _part(r, sales[yr], 45, 60) for yr in (2023, 2022)}
    net = {yr: _part(r, ebit[yr], 720, 780) for yr in (2023, 2022)}
    fcf = {yr: _part(r, ebitda[yr], 480, 620) for yr in (2023, 2022)}
    emp = {2023: r.randint(9_000, 14_000)}
    emp[2022] = emp[2023] - r.randint(-300, 600)
    disposal = dt.date(2023, r.randint(5, 9), r.randint(1, 12))
    signed = dt.date(2024, 2, 27)

    def change(key: dict[int, int]) -> str:
        return pct((D(key[2023]) / key[2022] - 1) * 100, 1, plus=True)

    def margin(e: int, s: int) -> str:
        return pct(D(e) / s * 100, 1)

    table = Table(
        header=[["in CHF million", "2023", "2022", "Change"]],
        rows=[
            ["Net sales", num(_m1(sales[2023]), 1), num(_m1(sales[2022]), 1), change(sales)],
            ["EBITDA", num(_m1(ebitda[2023]), 1), num(_m1(ebitda[2022]), 1), change(ebitda)],
            [
                "Operating income (EBIT)¹",
                num(_m1(ebit[2023]), 1),
                num(_m1(ebit[2022]), 1),
                change(ebit),
            ],
            [
                "EBIT margin",
                margin(ebit[2023], sales[2023]),
                margin(ebit[2022], sales[2022]),
                "",
            ],
            ["Net income", num(_m1(net[2023]), 1), num(_m1(net[2022]), 1), change(net)],
            ["Free cash flow", num(_m1(fcf[2023]), 1), num(_m1(fcf[2022]), 1), change(fcf)],
            ["Employees (headcount, 31.12.)", num(emp[2023]), num(emp[2022]), change(emp)],
        ],
        widths=[0.4, 0.2, 0.2, 0.2],
        align="LRRR",
        caption="Key figures",
    )
    foot = (
        f"¹ EBIT 2023 includes a one-off gain of CHF {_m1(gain)} million on the sale of the "
        f"{business} business, completed on {date_dmy_dots(disposal)}. The business "
        "contributed net sales until the date of completion."
    )
    blocks = [
        *cover(company, "Annual Report 2023", "Zurich, Switzerland"),
        Heading("2023 at a glance"),
        table,
        Footnotes([foot]),
        Spacer(10),
        Para(
            "Net sales grew in all regions. Order intake reached a new record, and the Board "
            "proposes an unchanged dividend to the Annual General Meeting."
        ),
        Para(f"Zurich, {date_dmy_dots(signed)} \u2014 The Board of Directors", "note"),
    ]
    doc = Doc(
        title=f"{company} Annual Report 2023",
        author=company,
        running_header=f"{company} | Annual Report 2023",
        blocks=blocks,
    )
    adj = ebit[2023] - gain
    return TaskSpec(
        id=tid,
        title="Operating income adjusted for a one-off gain in a footnote",
        difficulty="medium",
        tags=("pdf", "footnote", "adjustment", "dates"),
        intro=(
            "`/app/annual_report_2023.pdf` is the opening of a Swiss company's 2023 annual "
            "report with its key figures. Report the figures below; mind the footnotes."
        ),
        documents={"annual_report_2023.pdf": doc},
        answers=(
            money(
                "ebit_2023_reported",
                "Operating income (EBIT) for 2023 as reported",
                _m1(ebit[2023]),
                currency="CHF",
                scale="millions",
                tol="0.05",
                evidence=[num(_m1(ebit[2023]), 1)],
            ),
            money(
                "one_off_gain_2023",
                "The one-off gain included in 2023 EBIT",
                _m1(gain),
                currency="CHF",
                scale="millions",
                tol="0.05",
                evidence=[f"CHF {_m1(gain)} million"],
                oracle=f"CHF {_m1(gain)}m",
            ),
            money(
                "ebit_2023_adjusted",
                "2023 EBIT excluding that one-off gain",
                _m1(adj),
                currency="CHF",
                scale="millions",
                tol="0.05",
                evidence=[],
            ),
            percent(
                "ebit_margin_2023_adjusted",
                "Adjusted 2023 EBIT (excluding the gain) as a percentage of 2023 net sales",
                q(D(adj) / sales[2023] * 100, 4),
                tol="0.06",
                evidence=[],
                hint="one decimal is enough",
            ),
            date(
                "disposal_completion_date",
                f"The date the sale of the {business} business was completed",
                disposal,
                evidence=[date_dmy_dots(disposal)],
            ),
            number(
                "employees_2023",
                "Headcount at the end of 2023",
                D(emp[2023]),
                unit="employees",
                tol="0",
                evidence=[num(emp[2023])],
            ),
        ),
    )


# --------------------------------------------------------------------------- 5

_COUNTRIES: tuple[tuple[str, str], ...] = tuple(
    (c, region)
    for region, names in (
        (
            "Europe",
            "Austria,Belgium,Bulgaria,Croatia,Czech Republic,Denmark,Estonia,Finland,France,"
            "Germany,Greece,Hungary,Ireland,Italy,Latvia,Lithuania,Luxembourg,Netherlands,Norway,"
            "Poland,Portugal,Romania,Slovakia,Slovenia,Spain,Sweden,Switzerland,United Kingdom",
        ),
        (
            "Americas",
            "Argentina,Brazil,Canada,Chile,Colombia,Costa Rica,Mexico,Peru,United States,Uruguay",
        ),
        (
            "Asia-Pacific",
            "Australia,China,Hong Kong,India,Indonesia,Japan,Malaysia,New Zealand,Philippines,"
            "Singapore,South Korea,Taiwan,Thailand,Vietnam",
        ),
        (
            "Middle East & Africa",
            "Egypt,Israel,Kenya,Morocco,Nigeria,Qatar,Saudi Arabia,South Africa,Turkey,"
            "United Arab Emirates",
        ),
    )
    for c in names.split(",")
)
_BIG_MARKETS = ("United States", "Germany", "United Kingdom", "China", "Japan", "France")


def revenue_by_country() -> TaskSpec:
    """A 62-row country table over three pages with carried-forward subtotals."""
    tid = "revenue-by-country-across-pages"
    r = rng_for(tid)
    company = "Brightwater Foods Corp."
    rows = sorted(_COUNTRIES)
    exited = set(r.sample([c for c, _ in rows if c not in _BIG_MARKETS], 3))
    rev: dict[str, tuple[int, int]] = {}
    for country, _ in rows:
        big = country in _BIG_MARKETS
        y22 = r.randint(60_000, 180_000) if big else r.randint(800, 25_000)
        y23 = 0 if country in exited else y22 * r.randint(900, 1180) // 1000
        rev[country] = (y23, y22)
    per_page = 22
    chunks = [rows[i : i + per_page] for i in range(0, len(rows), per_page)]
    blocks: list[Block] = [
        *cover(company, "Supplementary Information 2023", "Unaudited"),
        Heading("Revenue by country"),
        Para(
            "Revenue is attributed to countries by the location of the customer. Countries in "
            "which the Group ceased trading during 2023 are shown with a dash. Amounts in "
            "thousands of U.S. dollars.",
        ),
    ]
    running = (0, 0)
    header = [["Country", "Region", "2023", "2022"]]
    for i, chunk in enumerate(chunks):
        body: list[list[str]] = []
        bold: set[int] = set()
        rules: set[int] = set()
        if i:
            body.append(["Brought forward", "", num(running[0]), num(running[1])])
            bold.add(0)
        for country, region in chunk:
            y23, y22 = rev[country]
            body.append([country, region, num(y23, nil=True), num(y22)])
            running = (running[0] + y23, running[1] + y22)
        label = "Carried forward" if i < len(chunks) - 1 else "Total"
        rules.add(len(body))
        bold.add(len(body))
        body.append([label, "", num(running[0]), num(running[1])])
        blocks.append(
            Table(
                header=header,
                rows=body,
                widths=[0.34, 0.26, 0.2, 0.2],
                align="LLRR",
                bold=frozenset(bold),
                rule_above=frozenset(rules),
            )
        )
        if i < len(chunks) - 1:
            blocks.append(PageBreak())
    total23 = running[0]
    europe = sum(rev[c][0] for c, reg in rows if reg == "Europe")
    trading = sum(1 for c, _ in rows if rev[c][0] > 0)
    largest = max(rows, key=lambda cr: rev[cr[0]][0])[0]
    candidates = [
        c for c, _ in chunks[1] if rev[c][0] > 0 and abs(D(rev[c][0]) / rev[c][1] - 1) * 100 >= 2
    ]
    pick = r.choice(candidates)
    growth = q((D(rev[pick][0]) / rev[pick][1] - 1) * 100, 4)
    doc = Doc(
        title=f"{company} Supplementary Information 2023",
        author=company,
        running_header=f"{company} | Supplementary Information 2023",
        blocks=blocks,
    )
    return TaskSpec(
        id=tid,
        title="A revenue table that runs across three pages",
        difficulty="hard",
        tags=("pdf", "long-table", "aggregation"),
        intro=(
            "`/app/supplementary_information_2023.pdf` lists a food group's revenue by country "
            "in a table that runs over several pages. Report the figures below for 2023."
        ),
        documents={"supplementary_information_2023.pdf": doc},
        answers=(
            money(
                "total_revenue_2023",
                "Total 2023 revenue over all countries",
                D(total23),
                currency="USD",
                scale="thousands",
                tol="0.5",
                evidence=[num(total23)],
            ),
            money(
                "europe_revenue_2023",
                "2023 revenue of all countries in the Europe region together",
                D(europe),
                currency="USD",
                scale="thousands",
                tol="0.5",
                evidence=[],
            ),
            number(
                "countries_with_revenue_2023",
                "How many countries had revenue in 2023",
                D(trading),
                unit="countries",
                tol="0",
                evidence=[],
            ),
            text(
                "largest_market_2023",
                "The country with the highest 2023 revenue",
                largest,
            ),
            percent(
                "growth_" + pick.lower().replace(" ", "_"),
                f"The change in {pick}'s revenue from 2022 to 2023 (negative for a decline)",
                growth,
                tol="0.06",
                evidence=[num(rev[pick][0]), num(rev[pick][1])],
                hint="one decimal is enough",
            ),
        ),
    )


# --------------------------------------------------------------------------- 6


def interim_report_dates() -> TaskSpec:
    """A European interim report with dates in four formats (and a US ADS column)."""
    tid = "interim-report-dates"
    r = rng_for(tid)
    company = "Marlowe Pharma SE"
    period_end = dt.date(2024, 9, 30)
    published = dt.date(2024, 11, 7)
    div = D(r.randint(35, 60)) / 100
    prior_div = div - D(r.randint(2, 6)) / 100
    rev9 = r.randint(21_000, 26_000)
    rev9_prior = rev9 * 1000 // r.randint(1040, 1090)
    ebit9 = _part(r, rev9, 180, 230)
    ebit9_prior = _part(r, rev9_prior, 170, 220)
    ord_ex, ord_rec, ord_pay = dt.date(2024, 11, 28), dt.date(2024, 11, 29), dt.date(2024, 12, 2)
    ads_ex, ads_rec, ads_pay = dt.date(2024, 11, 28), dt.date(2024, 11, 29), dt.date(2024, 12, 9)
    fy_results = dt.date(2025, 2, 20)
    agm = dt.date(2025, 6, 12)
    highlights = statement(
        ["9M 2024", "9M 2023", "Change"],
        [
            Line(
                "Revenue",
                (
                    _m1(rev9),
                    _m1(rev9_prior),
                    pct((D(rev9) / rev9_prior - 1) * 100, 1, plus=True),
                ),
            ),
            Line(
                "Operating profit (EBIT)",
                (
                    _m1(ebit9),
                    _m1(ebit9_prior),
                    pct((D(ebit9) / ebit9_prior - 1) * 100, 1, plus=True),
                ),
            ),
            Line("Interim dividend per share (€)", (num(div, 2), num(prior_div, 2), "")),
        ],
        decimals=1,
        header_label="in € million",
        label_width=0.46,
    )
    calendar = Table(
        header=[["Event", "Ordinary shares (Frankfurt)", "ADSs (NYSE)"]],
        rows=[
            ["Ex-dividend date", date_dmy_dots(ord_ex), date_mdy_slash(ads_ex)],
            ["Record date", date_dmy_dots(ord_rec), date_mdy_slash(ads_rec)],
            ["Dividend payment date", date_dmy_dots(ord_pay), date_mdy_slash(ads_pay)],
            ["Full-year results 2024", date_dmy_dots(fy_results), date_mdy_slash(fy_results)],
        ],
        widths=[0.34, 0.33, 0.33],
        align="LCC",
        caption="Financial calendar (dates for each listing, in local format)",
    )
    blocks = [
        *cover(
            company,
            "Interim Report Q3 2024",
            f"For the nine months ended {date_long(period_end)}",
            f"Published {published.isoformat()}",
        ),
        Heading("Highlights"),
        highlights,
        Para(
            f"The Management Board has declared an interim dividend of €{div} per ordinary "
            "share. One American Depositary Share (ADS) represents two ordinary shares; ADS "
            "holders receive the dividend in U.S. dollars, converted at the rate of the payment "
            "date by the depositary bank."
        ),
        calendar,
        Para(
            f"The Annual General Meeting will be held on {date_weekday(agm)} in Hamburg. "
            "Shareholders registered by the record date may attend in person or online."
        ),
        Para(
            "Forward-looking statements in this report reflect management's current views and "
            "are subject to risks and uncertainties.",
            "small",
        ),
    ]
    doc = Doc(
        title=f"{company} Interim Report Q3 2024",
        author=company,
        running_header=f"{company} | Interim Report Q3 2024",
        blocks=blocks,
    )
    return TaskSpec(
        id=tid,
        title="Dates in four formats from an interim report",
        difficulty="medium",
        tags=("pdf", "dates", "locale"),
        intro=(
            "`/app/interim_report_q3_2024.pdf` is the third-quarter interim report of a "
            "European company whose shares also trade in New York as ADSs. Report the dates "
            "and the amount below."
        ),
        documents={"interim_report_q3_2024.pdf": doc},
        answers=(
            date(
                "period_end_date",
                "The last day of the period the report covers",
                period_end,
                evidence=[date_long(period_end)],
            ),
            date(
                "publication_date",
                "The date the report was published",
                published,
                evidence=[published.isoformat()],
            ),
            date(
                "ordinary_dividend_payment_date",
                "The interim dividend payment date for ordinary shares",
                ord_pay,
                evidence=[date_dmy_dots(ord_pay)],
            ),
            date(
                "ads_dividend_payment_date",
                "The interim dividend payment date for ADS holders",
                ads_pay,
                evidence=[date_mdy_slash(ads_pay)],
            ),
            date(
                "agm_date",
                "The date of the next Annual General Meeting",
                agm,
                evidence=[date_weekday(agm)],
            ),
            money(
                "interim_dividend_per_share",
                "The interim dividend per ordinary share",
                div,
                currency="EUR",
                scale="units",
                tol="0.001",
                evidence=[f"€{div}"],
                oracle=f"€{div}",
            ),
        ),
    )


# --------------------------------------------------------------------------- 7

# (subsidiary, country, currency, symbol, base rate per USD, printed decimals of local)
_SUBSIDIARIES = (
    ("Northgate Japan K.K.", "Japan", "JPY", "¥", D("140.49"), 0),
    ("Northgate UK Limited", "United Kingdom", "GBP", "£", D("0.8043"), 1),
    ("Northgate Schweiz AG", "Switzerland", "CHF", "CHF ", D("0.8987"), 1),
    ("Northgate Deutschland GmbH", "Germany", "EUR", "€", D("0.9248"), 1),
    ("Northgate Canada Ltd.", "Canada", "CAD", "C$", D("1.3497"), 1),
    ("Northgate do Brasil Ltda.", "Brazil", "BRL", "R$", D("4.9953"), 1),
    ("Northgate India Private Limited", "India", "INR", "INR ", D("82.5990"), 0),
    ("Northgate Korea Co., Ltd.", "South Korea", "KRW", "KRW ", D("1305.41"), 0),
    ("Northgate Australia Pty Ltd", "Australia", "AUD", "A$", D("1.5053"), 1),
    ("Northgate Sverige AB", "Sweden", "SEK", "SEK ", D("10.6128"), 1),
)


def subsidiaries_multi_currency() -> TaskSpec:
    """Subsidiaries reporting in ten currencies, translated to USD thousands."""
    tid = "subsidiaries-multi-currency"
    r = rng_for(tid)
    company = "Northgate Industrial Holdings Inc."
    body: list[list[str]] = []
    usd: dict[str, int] = {}
    local: dict[str, D] = {}
    rates: dict[str, D] = {}
    for name, country, code, symbol, base, places in _SUBSIDIARIES:
        rate = q(base * r.randint(970, 1030) / 1000, 4)
        target = r.randint(80_000, 620_000)  # USD thousands
        loc = q(D(target) * rate / 1000, places)  # local millions
        in_usd = int(q(loc * 1000 / rate, 0))
        usd[name], local[name], rates[name] = in_usd, loc, rate
        body.append([name, country, code, f"{symbol}{num(loc, places)}", num(rate, 4), num(in_usd)])
    total = sum(usd.values())
    body.append(["Total", "", "", "", "", num(total)])
    table = Table(
        header=[
            [
                "Subsidiary",
                "Country",
                "Functional\ncurrency",
                "Revenue, local\ncurrency (millions)",
                "Average rate\n(per USD)",
                "Revenue\n(USD thousands)",
            ]
        ],
        rows=body,
        widths=[0.27, 0.14, 0.11, 0.18, 0.14, 0.16],
        align="LLCRRR",
        bold=frozenset({len(body) - 1}),
        rule_above=frozenset({len(body) - 1}),
        font_size=7.5,
    )
    blocks = [
        *cover(company, "Annual Report 2023", "Notes to the consolidated financial statements"),
        Heading("Note 22 \u2014 Principal operating subsidiaries"),
        Para(
            "The table lists the Group's principal operating subsidiaries, their functional "
            "currencies and their external revenue for 2023, in local currency and translated "
            "into U.S. dollars, the Group's presentation currency, at the average exchange rate "
            "for the year. All subsidiaries are wholly owned."
        ),
        table,
    ]
    doc = Doc(
        title=f"{company} Annual Report 2023 - Note 22",
        author=company,
        running_header=f"{company} | Annual Report 2023",
        blocks=blocks,
    )
    japan, uk, swiss, brazil = (s[0] for s in _SUBSIDIARIES[:3] + _SUBSIDIARIES[5:6])
    largest = max(usd, key=lambda n: usd[n])
    return TaskSpec(
        id=tid,
        title="Subsidiaries reporting in ten currencies",
        difficulty="medium",
        tags=("pdf", "currency", "fx"),
        intro=(
            "`/app/note_22_subsidiaries.pdf` is a note from a US group's annual report listing "
            "its subsidiaries' revenue in local currency and in U.S. dollars. Report the figures "
            "below for 2023."
        ),
        documents={"note_22_subsidiaries.pdf": doc},
        answers=(
            money(
                "japan_revenue_local",
                f"{japan}'s revenue in its functional currency",
                local[japan],
                currency="JPY",
                scale="millions",
                tol="0.5",
                evidence=[num(local[japan])],
                oracle=f"¥{num(local[japan])} million",
            ),
            currency(
                "swiss_functional_currency",
                f"{swiss}'s functional currency",
                "CHF",
                evidence=["CHF"],
            ),
            money(
                "uk_revenue_usd",
                f"{uk}'s revenue translated into U.S. dollars",
                D(usd[uk]),
                currency="USD",
                scale="thousands",
                tol="0.5",
                evidence=[num(usd[uk])],
            ),
            text(
                "largest_subsidiary_by_usd_revenue",
                "The subsidiary with the highest revenue in U.S. dollars",
                largest,
            ),
            number(
                "brazil_average_rate",
                f"The average exchange rate used for {brazil}",
                rates[brazil],
                unit="BRL per USD",
                tol="0.00005",
                evidence=[num(rates[brazil], 4)],
            ),
        ),
    )


# --------------------------------------------------------------------------- 8


def fund_factsheet() -> TaskSpec:
    """A monthly fund factsheet: percentages (some negative, one below 1%), fund size."""
    tid = "fund-factsheet"
    r = rng_for(tid)
    fund = "Tessaline Global Equity Income Fund"
    manager = "Tessaline Asset Management Ltd"
    as_at = dt.date(2024, 10, 31)
    launch = dt.date(2011, 3, r.randint(14, 28))
    size_bn = D(r.randint(105, 180)) / 100
    ocf = D(r.randint(45, 85)) / 100

    def ret(lo: int, hi: int, *, min_abs: int = 0) -> D:
        while True:
            v = D(r.randint(lo, hi)) / 10
            if abs(v) * 10 >= min_abs:
                return v

    periods = ("1 month", "3 months", "6 months", "YTD", "1 year", "3 years p.a.", "5 years p.a.")
    fund_r = [
        ret(-40, 30),
        ret(-60, 50),
        ret(-40, 90),
        ret(20, 160),
        ret(60, 220, min_abs=10),
        ret(-45, -10, min_abs=10),
        ret(40, 110),
    ]
    bench_r = [v + D(r.randint(-15, 15)) / 10 for v in fund_r]
    perf = Table(
        header=[["%", *periods]],
        rows=[
            ["Fund (I Acc GBP)", *[pct(v) for v in fund_r]],
            ["Benchmark", *[pct(v) for v in bench_r]],
        ],
        widths=[0.23, *[0.11] * 7],
        align="L" + "R" * 7,
        caption="Cumulative and annualised performance (in GBP, net of fees)",
        font_size=7.5,
    )
    years = (2019, 2020, 2021, 2022, 2023)
    cal = [ret(-80, 240) for _ in years]
    calendar = Table(
        header=[["%", *map(str, years)]],
        rows=[["Fund (I Acc GBP)", *[pct(v) for v in cal]]],
        widths=[0.3, *[0.14] * 5],
        align="L" + "R" * 5,
        caption="Calendar year performance",
    )
    equities = D(r.randint(930, 975)) / 10
    facts = Table(
        header=[["Fund facts", ""]],
        rows=[
            ["Fund manager", manager],
            ["Launch date", date_long(launch)],
            ["Fund size", f"£{size_bn}bn"],
            ["Share class", "I Accumulation GBP"],
            ["Ongoing charges figure (OCF)", f"{ocf}%"],
            ["Benchmark", "MSCI All Country World Index (net)"],
            ["Asset allocation", f"Equities {equities}%, cash {100 - equities}%"],
        ],
        widths=[0.35, 0.65],
        align="LL",
    )
    blocks = [
        Heading(fund, 1),
        Para(f"Monthly factsheet \u2014 data as at {date_long(as_at)}", "note"),
        Para(
            "The fund aims to provide a growing income and long-term capital growth by "
            "investing in companies worldwide with sustainable dividends. Past performance is "
            "not a reliable indicator of future results."
        ),
        facts,
        perf,
        calendar,
        Para(
            "Source: Tessaline, bid-to-bid with net income reinvested. Annualised figures are "
            "marked p.a.; the others are cumulative.",
            "small",
        ),
    ]
    doc = Doc(
        title=f"{fund} factsheet",
        author=manager,
        running_header=f"{fund} | Factsheet",
        blocks=blocks,
    )
    return TaskSpec(
        id=tid,
        title="Percentages and fund size from a fund factsheet",
        difficulty="easy",
        tags=("pdf", "percentages", "funds"),
        intro=(
            "`/app/factsheet.pdf` is a monthly factsheet of an investment fund. Report the "
            "figures below for the fund's I Acc GBP share class (not the benchmark)."
        ),
        documents={"factsheet.pdf": doc},
        answers=(
            text("fund_name", "The fund's name", fund),
            date(
                "factsheet_date",
                "The date the factsheet's data is as at",
                as_at,
                evidence=[date_long(as_at)],
            ),
            percent(
                "one_year_return",
                "The fund's 1-year return",
                fund_r[4],
                tol="0.001",
                evidence=[pct(fund_r[4])],
            ),
            percent(
                "three_year_annualised_return",
                "The fund's 3-year annualised return (negative for a loss)",
                fund_r[5],
                tol="0.001",
                evidence=[pct(fund_r[5])],
                oracle=pct(fund_r[5]),
            ),
            percent(
                "ongoing_charges",
                "The ongoing charges figure",
                ocf,
                tol="0.001",
                evidence=[f"{ocf}%"],
                bare="points",
                oracle=ocf,
                hint="e.g. 1.25 means 1.25%",
            ),
            money(
                "fund_size",
                "The fund's size",
                size_bn * 1000,
                currency="GBP",
                scale="millions",
                tol="0.5",
                evidence=[f"£{size_bn}bn"],
                oracle=f"£{size_bn}bn",
            ),
        ),
    )


# --------------------------------------------------------------------------- 9


def debt_maturity_schedule() -> TaskSpec:
    """A borrowings note: maturities, coupons, a weighted average to compute."""
    tid = "debt-maturity-schedule"
    r = rng_for(tid)
    company = "Quillon Energy Inc."
    year_end = dt.date(2023, 12, 31)

    def coupon(lo: int, hi: int) -> D:
        return D(r.randint(lo // 125, hi // 125) * 125) / 1000

    def day(year: int) -> dt.date:
        return dt.date(year, r.choice((3, 6, 9, 12)), r.choice((1, 15)))

    notes = [
        (coupon(2_750, 3_250), day(2025), 0),  # repaid in 2023
        (coupon(3_500, 4_250), day(2026), r.randint(16, 28) * 25_000),
        (coupon(4_375, 5_000), day(2028), r.randint(16, 28) * 25_000),
        (coupon(5_000, 5_750), day(2031), r.randint(12, 24) * 25_000),
        (coupon(5_875, 6_750), day(2034), r.randint(10, 20) * 25_000),
    ]
    repaid = dt.date(2023, 6, 15)
    old_principal = r.randint(10, 16) * 25_000
    margin = D(r.randint(12, 18) * 125) / 1000
    term_mat = dt.date(2027, r.choice((4, 5, 7, 8)), r.choice((1, 15)))
    term_principal = r.randint(8, 16) * 25_000
    rcf_mat = dt.date(2028, 11, 30)
    body: list[list[str]] = []
    for i, (c, mat, principal) in enumerate(notes):
        prev = old_principal if i == 0 else principal
        disc = 0 if principal == 0 else r.randint(800, 4_200)
        prev_disc = 0 if prev == 0 else disc + r.randint(300, 900)
        body.append(
            [
                f"{c:.3f}% Senior Notes due {mat.year}",
                date_abbr_us(mat),
                num(principal, nil=True),
                num(principal - disc, nil=True),
                num(prev - prev_disc, nil=True),
            ]
        )
    tl_disc = r.randint(900, 2_000)
    body.append(
        [
            f"Term Loan A due {term_mat.year} (SOFR + {margin:.3f}%)",
            date_abbr_us(term_mat),
            num(term_principal),
            num(term_principal - tl_disc),
            num(term_principal + 50_000 - tl_disc - 400),
        ]
    )
    body.append(
        [
            "$750 million Revolving Credit Facility",
            date_abbr_us(rcf_mat),
            num(0, nil=True),
            num(0, nil=True),
            num(0, nil=True),
        ]
    )
    principal_total = sum(p for _, _, p in notes) + term_principal
    body.append(["Total", "", num(principal_total), "", ""])
    table = Table(
        header=[
            [
                "Instrument",
                "Maturity",
                "Principal\nDec 31, 2023",
                "Carrying amount\nDec 31, 2023",
                "Carrying amount\nDec 31, 2022",
            ]
        ],
        rows=body,
        widths=[0.36, 0.14, 0.16, 0.17, 0.17],
        align="LLRRR",
        bold=frozenset({len(body) - 1}),
        rule_above=frozenset({len(body) - 1}),
        font_size=8,
    )
    fixed = [(c, p) for c, _, p in notes if p]
    wac = q(sum(c * p for c, p in fixed) / sum(p for _, p in fixed), 4)
    outstanding = [mat for _, mat, p in notes if p] + [term_mat]
    blocks = [
        *cover(company, "Form 10-K 2023", "Notes to Consolidated Financial Statements"),
        Heading("Note 14 \u2014 Debt"),
        Para(
            "The Company's long-term debt consisted of the following (in thousands of U.S. "
            "dollars). Carrying amounts are net of unamortized discounts and debt issuance "
            "costs. The senior notes bear interest at fixed rates, payable semi-annually; the "
            "term loan bears interest at Term SOFR plus the margin shown."
        ),
        table,
        Para(
            f"On {date_us(repaid)}, the Company redeemed all of its outstanding "
            f"{notes[0][0]:.3f}% Senior Notes due {notes[0][1].year} at par using cash on hand. "
            "No amounts were drawn under the Revolving Credit Facility at December 31, 2023 or "
            "2022."
        ),
    ]
    doc = Doc(
        title=f"{company} Form 10-K 2023 - Note 14",
        author=company,
        running_header=f"{company} | Form 10-K 2023",
        blocks=blocks,
    )
    c2031 = notes[3][0]
    return TaskSpec(
        id=tid,
        title="Maturities and coupons from a debt note",
        difficulty="hard",
        tags=("pdf", "debt", "weighted-average", "dates"),
        intro=(
            "`/app/note_14_debt.pdf` is the debt note of a US company's annual report. Report "
            f"the figures below as of {date_us(year_end)}."
        ),
        documents={"note_14_debt.pdf": doc},
        answers=(
            date(
                "earliest_maturity_outstanding",
                "The maturity date of the earliest-maturing instrument with principal "
                "outstanding at year end",
                min(outstanding),
                evidence=[date_abbr_us(min(outstanding))],
            ),
            percent(
                "coupon_2031_notes",
                "The coupon of the senior notes due 2031",
                c2031,
                tol="0.0005",
                evidence=[f"{c2031:.3f}%"],
            ),
            percent(
                "term_loan_margin",
                "The margin over SOFR on the term loan",
                margin,
                tol="0.0005",
                evidence=[f"{margin:.3f}%"],
            ),
            money(
                "total_principal_outstanding",
                "Total principal outstanding at year end",
                _k_to_m(principal_total),
                currency="USD",
                scale="millions",
                tol="0.05",
                evidence=[num(principal_total)],
            ),
            percent(
                "weighted_average_coupon",
                "The principal-weighted average coupon of the fixed-rate senior notes "
                "outstanding at year end",
                wac,
                tol="0.006",
                evidence=[],
                hint="two decimals",
            ),
        ),
    )


# --------------------------------------------------------------------------- 10

_ITEMS = (
    "A4 copy paper 80 g/m², box of 5 reams",
    "A3 copy paper 80 g/m², ream",
    "Recycled A4 paper, ream",
    "Lever arch file, 80 mm, black",
    "Ring binder A4, 2 rings, blue",
    "Suspension files, pack of 25",
    "Document wallet, assorted, pack of 50",
    "Ballpoint pen, blue, box of 50",
    "Gel pen 0.7 mm, black, box of 12",
    "Whiteboard marker set, 4 colours",
    "Permanent marker, black, box of 10",
    "Highlighter, assorted, wallet of 6",
    "HB pencils with eraser, box of 12",
    "Sticky notes 76 x 76 mm, 12 pads",
    "Index tabs, 1–31, A4",
    "Staples 24/6, box of 5,000",
    "Desktop stapler, 30 sheets",
    "Heavy-duty stapler, 100 sheets",
    "Hole punch, 2 holes, 40 sheets",
    "Scissors 21 cm, soft grip",
    "Adhesive tape 19 mm x 33 m, 8 rolls",
    "Tape dispenser, weighted",
    "Glue stick 40 g, pack of 10",
    "Correction tape, pack of 10",
    "Envelopes C4, self-seal, box of 250",
    "Envelopes DL, window, box of 500",
    "Padded envelopes, size D, pack of 100",
    "Shipping boxes 400 x 300 x 200 mm, 20",
    "Packing tape, brown, 6 rolls",
    "Laser toner cartridge, black, high yield",
    "Inkjet cartridge multipack, CMYK",
    "USB-C flash drive, 64 GB",
    "Wireless mouse, ergonomic",
    "Keyboard, wired, German layout",
    "Monitor stand, adjustable",
    "Desk organiser, mesh, black",
    "Paper tray, stackable, pack of 3",
    "Cable ties, assorted, pack of 200",
    "AA alkaline batteries, pack of 24",
    "Whiteboard cleaning spray, 250 ml",
    "Microfibre cloths, pack of 10",
    "Coffee filter paper no. 4, 100",
    "Paper cups 200 ml, pack of 100",
    "Hand towels, Z-fold, case of 3,000",
    "Archive boxes, pack of 10",
    "Label printer tape 12 mm, black on white",
    "Laminating pouches A4, 100 pack",
    "Calculator, desktop, 12 digits",
)


def invoice_line_items() -> TaskSpec:
    """A two-page supplier invoice with VAT."""
    tid = "invoice-line-items"
    r = rng_for(tid)
    supplier = "Wexford Office Supplies B.V."
    customer = "Orrin Instruments GmbH"
    number_ = f"INV-2025-{r.randint(1_000, 9_999):06d}"
    issued = dt.date(2025, 2, 3)
    due = issued + dt.timedelta(days=30)
    vat_rate = D(21)
    items = r.sample(_ITEMS, 44)
    body: list[list[str]] = []
    subtotal = D(0)
    for i, item in enumerate(items, start=1):
        qty = r.randint(1, 40)
        price = D(r.randint(85, 18_000)) / 100
        line = qty * price
        subtotal += line
        body.append(
            [
                str(i),
                f"SKU-{r.randint(10_000, 99_999)}",
                item,
                str(qty),
                num(price, 2),
                num(line, 2),
            ]
        )
    vat = q(subtotal * vat_rate / 100, 2)
    total = subtotal + vat
    lines = Table(
        header=[["#", "Item no.", "Description", "Qty", "Unit price €", "Amount €"]],
        rows=body,
        widths=[0.05, 0.12, 0.5, 0.07, 0.13, 0.13],
        align="LLLRRR",
        font_size=8,
    )
    totals = Table(
        header=[],
        rows=[
            ["Subtotal (net)", f"€{num(subtotal, 2)}"],
            [f"VAT {vat_rate}%", f"€{num(vat, 2)}"],
            ["Total due", f"€{num(total, 2)}"],
        ],
        widths=[0.8, 0.2],
        align="RR",
        bold=frozenset({2}),
        rule_above=frozenset({2}),
    )
    blocks = [
        Heading(supplier, 1),
        Para(
            "Keizersgracht 214, 1016 DZ Amsterdam, the Netherlands \u2014 VAT NL859311420B01",
            "small",
        ),
        Spacer(8),
        Heading("INVOICE", 2),
        Table(
            header=[["Invoice number", number_]],
            rows=[
                ["Invoice date", date_dd_mon_yyyy(issued)],
                ["Customer", customer],
                ["Customer address", "Industriestraße 12, 70565 Stuttgart, Germany"],
                ["Payment terms", "30 days net"],
                ["Due date", date_dd_mon_yyyy(due)],
            ],
            widths=[0.25, 0.75],
            align="LL",
        ),
        lines,
        totals,
        Para(
            "Please quote the invoice number with your payment. Bank: IBAN NL91 ABNA 0417 1643 "
            "00, BIC ABNANL2A.",
            "small",
        ),
    ]
    doc = Doc(
        title=f"Invoice {number_}",
        author=supplier,
        running_header=f"{supplier} | Invoice {number_}",
        blocks=blocks,
    )
    return TaskSpec(
        id=tid,
        title="Header fields and totals of a two-page invoice",
        difficulty="easy",
        tags=("pdf", "invoice", "currency"),
        intro="`/app/invoice.pdf` is a supplier's invoice. Report the fields below.",
        documents={"invoice.pdf": doc},
        answers=(
            text("invoice_number", "The invoice number", number_, exact=True),
            text("supplier_name", "The supplier's company name", supplier),
            date(
                "invoice_date",
                "The invoice date",
                issued,
                evidence=[date_dd_mon_yyyy(issued)],
            ),
            date("due_date", "The payment due date", due, evidence=[date_dd_mon_yyyy(due)]),
            percent("vat_rate", "The VAT rate charged", vat_rate, tol="0", evidence=["21%"]),
            money(
                "total_due",
                "The total amount due, VAT included",
                total,
                currency="EUR",
                scale="units",
                tol="0.005",
                evidence=[num(total, 2)],
                oracle=f"€{num(total, 2)}",
            ),
        ),
    )


# --------------------------------------------------------------------------- 11


def free_cash_flow() -> TaskSpec:
    """A cash flow statement in C$ thousands and a glossary defining free cash flow."""
    tid = "free-cash-flow-definition"
    r = rng_for(tid)
    company = "Halvorsen Maritime Ltd."
    y: dict[int, dict[str, int]] = {}
    opening = r.randint(60_000, 90_000)
    for year in (2022, 2023):
        profit = r.randint(40_000, 75_000)
        dep = r.randint(28_000, 36_000)
        amort = r.randint(6_000, 9_000)
        fin = r.randint(7_000, 11_000)
        taxx = _part(r, profit, 250, 300)
        wc = r.randint(-12_000, 6_000)
        int_paid = -r.randint(6_000, 10_000)
        tax_paid = -r.randint(12_000, 20_000)
        cfo = profit + dep + amort + fin + taxx + wc + int_paid + tax_paid
        ppe = -r.randint(30_000, 45_000)
        disp = r.randint(1_000, 6_000)
        intang = -r.randint(5_000, 9_000)
        acq = -r.randint(20_000, 35_000) if year == 2023 else 0
        int_rec = r.randint(500, 1_500)
        cfi = ppe + disp + intang + acq + int_rec
        borrow = r.randint(20_000, 40_000) if year == 2023 else 0
        repay = -r.randint(10_000, 25_000)
        lease = -r.randint(4_000, 7_000)
        divs = -r.randint(12_000, 18_000)
        cff = borrow + repay + lease + divs
        fx = r.randint(-1_500, 1_500)
        net = cfo + cfi + cff
        y[year] = dict(
            profit=profit,
            dep=dep,
            amort=amort,
            fin=fin,
            taxx=taxx,
            wc=wc,
            int_paid=int_paid,
            tax_paid=tax_paid,
            cfo=cfo,
            ppe=ppe,
            disp=disp,
            intang=intang,
            acq=acq,
            int_rec=int_rec,
            cfi=cfi,
            borrow=borrow,
            repay=repay,
            lease=lease,
            divs=divs,
            cff=cff,
            net=net,
            open=opening,
            fx=fx,
            close=opening + net + fx,
        )
        opening = opening + net + fx
    a, b = y[2023], y[2022]

    def row(label: str, key: str, **kw: Any) -> Line:
        return Line(label, (a[key], b[key]), **kw)

    table = statement(
        ["2023", "2022"],
        [
            Line("Operating activities"),
            row("Profit for the year", "profit"),
            row("Depreciation of property, plant and equipment", "dep", indent=1),
            row("Amortisation of intangible assets", "amort", indent=1),
            row("Net finance costs", "fin", indent=1),
            row("Income tax expense", "taxx", indent=1),
            row("Change in working capital", "wc", indent=1),
            row("Interest paid", "int_paid"),
            row("Income taxes paid", "tax_paid"),
            row("Net cash from operating activities", "cfo", bold=True, rule=True),
            Line("Investing activities"),
            row("Purchases of property, plant and equipment", "ppe"),
            row("Proceeds from disposals of property, plant and equipment", "disp"),
            row("Purchases of intangible assets (capitalised development)", "intang"),
            row("Acquisition of subsidiary, net of cash acquired", "acq"),
            row("Interest received", "int_rec"),
            row("Net cash used in investing activities", "cfi", bold=True, rule=True),
            Line("Financing activities"),
            row("Proceeds from borrowings", "borrow"),
            row("Repayment of borrowings", "repay"),
            row("Payment of lease liabilities (principal)", "lease"),
            row("Dividends paid", "divs"),
            row("Net cash used in financing activities", "cff", bold=True, rule=True),
            row("Net increase (decrease) in cash and cash equivalents", "net", rule=True),
            row("Cash and cash equivalents at 1 January", "open"),
            row("Effect of exchange rate changes", "fx"),
            row("Cash and cash equivalents at 31 December", "close", bold=True, rule=True),
        ],
        label_width=0.6,
        font_size=8,
    )
    fcf = {yr: y[yr]["cfo"] + y[yr]["ppe"] + y[yr]["intang"] + y[yr]["disp"] for yr in y}
    blocks = [
        *cover(company, "Annual Report 2023", "Vancouver, British Columbia"),
        Heading("Consolidated statement of cash flows"),
        Para("For the year ended 31 December (in thousands of Canadian dollars, C$'000)", "note"),
        table,
        PageBreak(),
        Heading("Glossary of non-IFRS measures"),
        Para(
            "<b>Free cash flow</b> is net cash from operating activities, less purchases of "
            "property, plant and equipment and purchases of intangible assets, plus proceeds "
            "from disposals of property, plant and equipment. It excludes acquisitions of "
            "subsidiaries, interest received and payments of lease liabilities. Management uses "
            "free cash flow to assess the cash available for dividends and debt reduction."
        ),
        Para(
            "<b>Net debt</b> is borrowings and lease liabilities less cash and cash "
            "equivalents. <b>Adjusted EBITDA</b> is profit for the year before net finance "
            "costs, income tax, depreciation and amortisation."
        ),
    ]
    doc = Doc(
        title=f"{company} Annual Report 2023",
        author=company,
        running_header=f"{company} | Annual Report 2023",
        blocks=blocks,
    )
    return TaskSpec(
        id=tid,
        title="Free cash flow by the report's own definition",
        difficulty="hard",
        tags=("pdf", "cash-flow", "definition", "non-ifrs"),
        intro=(
            "`/app/annual_report_2023.pdf` contains a Canadian company's cash flow statement "
            "and a glossary of the non-IFRS measures it reports. Report the figures below."
        ),
        documents={"annual_report_2023.pdf": doc},
        answers=(
            money(
                "operating_cash_flow_2023",
                "Net cash from operating activities in 2023",
                D(a["cfo"]),
                currency="CAD",
                scale="thousands",
                tol="0.5",
                evidence=[num(a["cfo"])],
            ),
            money(
                "purchases_of_ppe_2023",
                "Purchases of property, plant and equipment in 2023, as the statement shows "
                "it (an outflow is negative)",
                D(a["ppe"]),
                currency="CAD",
                scale="thousands",
                tol="0.5",
                evidence=[num(a["ppe"])],
                oracle=num(a["ppe"]),
            ),
            money(
                "free_cash_flow_2023",
                "Free cash flow for 2023, as the glossary defines it",
                _k_to_m(fcf[2023]),
                currency="CAD",
                scale="millions",
                tol="0.05",
                evidence=[],
                hint="at least one decimal",
            ),
            money(
                "free_cash_flow_2022",
                "Free cash flow for 2022, as the glossary defines it",
                _k_to_m(fcf[2022]),
                currency="CAD",
                scale="millions",
                tol="0.05",
                evidence=[],
                oracle=f"C${fcf[2022]:,}k",
                hint="at least one decimal",
            ),
            currency(
                "reporting_currency",
                "The currency the cash flow statement is presented in",
                "CAD",
                evidence=["Canadian dollars"],
            ),
        ),
    )


# --------------------------------------------------------------------------- 12


def two_reports_growth() -> TaskSpec:
    """Two annual reports: growth against the restated year, and the original figure."""
    tid = "two-reports-restated-growth"
    r = rng_for(tid)
    company = "Lysander Consumer Brands S.A."
    business = "Lumo Home Fragrance"
    cont = {2022: r.randint(52_000, 61_000)}
    cont[2023] = cont[2022] * r.randint(1030, 1070) // 1000
    cont[2024] = cont[2023] * r.randint(1020, 1080) // 1000
    lumo = {2022: r.randint(3_800, 5_200)}
    lumo[2023] = lumo[2022] * r.randint(940, 1010) // 1000

    def items(rev: int) -> dict[str, int]:
        cos = _part(r, rev, 520, 560)
        mkt = _part(r, rev, 180, 210)
        adm = _part(r, rev, 90, 110)
        return dict(rev=rev, cos=-cos, gp=rev - cos, mkt=-mkt, adm=-adm, op=rev - cos - mkt - adm)

    cont_rows = {yr: items(cont[yr]) for yr in (2022, 2023, 2024)}
    lumo_rows = {yr: items(lumo[yr]) for yr in (2022, 2023)}
    orig_rows = {
        yr: {k: cont_rows[yr][k] + lumo_rows[yr][k] for k in cont_rows[yr]} for yr in lumo_rows
    }
    as_reported = {yr: orig_rows[yr]["rev"] for yr in orig_rows}

    def pl(
        rows: dict[int, dict[str, int]], years: tuple[int, int], labels: tuple[str, str]
    ) -> Table:
        first, second = years

        def line(label: str, key: str, **kw: Any) -> Line:
            return Line(label, (_m1(rows[first][key]), _m1(rows[second][key])), **kw)

        return statement(
            list(labels),
            [
                line("Revenue", "rev", bold=True),
                line("Cost of sales", "cos"),
                line("Gross profit", "gp", rule=True),
                line("Marketing and selling expenses", "mkt"),
                line("General and administrative expenses", "adm"),
                line("Operating profit", "op", bold=True, rule=True),
            ],
            decimals=1,
            header_label="in € million",
        )

    report23 = Doc(
        title=f"{company} Annual Report 2023",
        author=company,
        running_header=f"{company} | Annual Report 2023",
        blocks=[
            *cover(company, "Annual Report 2023", "Luxembourg"),
            Heading("Consolidated income statement"),
            Para("For the year ended 31 December 2023", "note"),
            pl(orig_rows, (2023, 2022), ("2023", "2022")),
            Para(
                "All four business units, including Lumo Home Fragrance, contributed to revenue "
                "growth in 2023.",
            ),
        ],
    )
    disc_op_2023 = lumo_rows[2023]["op"]
    report24 = Doc(
        title=f"{company} Annual Report 2024",
        author=company,
        running_header=f"{company} | Annual Report 2024",
        blocks=[
            *cover(company, "Annual Report 2024", "Luxembourg"),
            Heading("Consolidated income statement"),
            Para("For the year ended 31 December 2024 \u2014 continuing operations", "note"),
            pl(cont_rows, (2024, 2023), ("2024", "2023 restated¹")),
            Footnotes(
                [
                    "¹ The 2023 comparatives have been restated to present the "
                    f"{business} business as a discontinued operation (note 5)."
                ]
            ),
            Spacer(10),
            Heading("Note 5 \u2014 Discontinued operation", 2),
            Para(
                f"In September 2024 the Board committed to a plan to sell the {business} "
                "business. It is presented as held for sale and as a discontinued operation; its "
                f"operating profit for 2023 was €{_m1(disc_op_2023)} million."
            ),
        ],
    )
    growth = q((D(cont[2024]) / cont[2023] - 1) * 100, 4)
    return TaskSpec(
        id=tid,
        title="Growth against a restated year, across two annual reports",
        difficulty="hard",
        tags=("pdf", "multi-document", "restatement", "growth"),
        intro=(
            "`/app/annual_report_2023.pdf` and `/app/annual_report_2024.pdf` are two "
            "consecutive annual reports of the same group. Report the figures below."
        ),
        documents={"annual_report_2023.pdf": report23, "annual_report_2024.pdf": report24},
        answers=(
            money(
                "revenue_2024",
                "Revenue from continuing operations for 2024",
                _m1(cont[2024]),
                currency="EUR",
                scale="millions",
                tol="0.05",
                evidence=[num(_m1(cont[2024]), 1)],
            ),
            money(
                "revenue_2023_restated",
                "2023 revenue as restated in the 2024 report",
                _m1(cont[2023]),
                currency="EUR",
                scale="millions",
                tol="0.05",
                evidence=[num(_m1(cont[2023]), 1)],
            ),
            money(
                "revenue_2023_originally_reported",
                "2023 revenue as originally reported in the 2023 report",
                _m1(as_reported[2023]),
                currency="EUR",
                scale="millions",
                tol="0.05",
                evidence=[num(_m1(as_reported[2023]), 1)],
                oracle=f"€{num(_m1(as_reported[2023]), 1)}m",
            ),
            percent(
                "revenue_growth_2024",
                "Revenue growth from 2023 (restated) to 2024",
                growth,
                tol="0.06",
                evidence=[],
                hint="one decimal is enough",
            ),
            text(
                "discontinued_business",
                "The business presented as a discontinued operation in 2024",
                business,
                aliases=[f"{business} business"],
            ),
        ),
    )


BUILDERS: tuple[Callable[[], TaskSpec], ...] = (
    annual_report_income_statement,
    effective_tax_rate,
    restated_comparatives,
    footnote_adjusted_ebit,
    revenue_by_country,
    interim_report_dates,
    subsidiaries_multi_currency,
    fund_factsheet,
    debt_maturity_schedule,
    invoice_line_items,
    free_cash_flow,
    two_reports_growth,
)


def build_all() -> list[TaskSpec]:
    """Every bundled document task, sorted by id."""
    return sorted((build() for build in BUILDERS), key=lambda t: t.id)
