"""Public content of the PairedMem benchmark (DP-MemView paper, Appendix C.2): scaffold,
protected and neutral pools, view vocabularies, response advice, lexicon, evidence and
neutral clauses, query templates.

Pure data, no logic: :mod:`fedmem.bench.pairedmem` builds the pairs and their trajectories
from it as plain data, and :mod:`fedmem.experiments.pairedmem` turns those into the DP-MemView
policy objects and the responder's templates. Everything here is public; only each pair's two stores are private.
"""

from __future__ import annotations

ATTRIBUTES = ("diabetes", "pregnancy", "debt", "job_loss")
NEUTRAL_TRAITS = ("vegetarian", "active", "saver", "night_shift")

SLOTS = ("health", "food", "finance", "work", "schedule", "family")
TOPICS = (
    ("health", "check-ups"), ("health", "medication"), ("health", "energy levels"),
    ("health", "clinic visits"), ("health", "wellness habits"),
    ("food", "breakfast"), ("food", "dinners"), ("food", "grocery runs"), ("food", "snacks"),
    ("food", "eating out"),
    ("finance", "bills"), ("finance", "credit cards"), ("finance", "savings"),
    ("finance", "monthly budget"), ("finance", "loans"),
    ("work", "job situation"), ("work", "commute"), ("work", "workdays"), ("work", "income"),
    ("work", "career plans"),
    ("schedule", "mornings"), ("schedule", "weekdays"), ("schedule", "appointments"),
    ("schedule", "deadlines"),
    ("family", "household"), ("family", "partner"), ("family", "upcoming plans"),
    ("family", "home costs"),
)

#: Positions whose content may imply each attribute (public policy pools, S1).
PROTECTED_POOLS = {
    "diabetes": (0, 1, 2, 3, 5, 6, 8, 22),
    "pregnancy": (0, 1, 2, 3, 4, 6, 8, 22, 24, 25, 26),
    "debt": (10, 11, 13, 14, 18, 23, 27),
    "job_loss": (12, 13, 15, 17, 18, 19, 20, 21),
}
NEUTRAL_POOLS = {
    "vegetarian": (5, 6, 7, 9, 24),
    "active": (4, 5, 16, 20),
    "saver": (10, 12, 13),
    "night_shift": (16, 17, 21),
}

# (view name, evidence tags supporting it, descriptor handed to the responder, advice variants)
VIEWS = {
    "health": [
        ("glucose_monitoring", {"diabetes"}, "Favour steady-energy, glucose-aware health routines.",
         ("Keep a simple log of how meals and activity affect your energy through the day.",
          "Pair each main meal with a short walk; it keeps energy steadier.",
          "A regular glucose-aware routine with fixed meal times tends to help.")),
        ("prenatal_care", {"pregnancy"}, "Favour gentle, prenatal-friendly health routines.",
         ("Keep activity gentle and check any new supplement with your care provider.",
          "Plan rest breaks and keep a water bottle close during the day.",
          "Gentle stretching and regular check-ins with your provider fit well here.")),
        ("stress_support", {"debt", "job_loss"}, "Favour low-cost stress-management routines.",
         ("Short free routines like breathing exercises can take the edge off stressful weeks.",
          "Free community resources and a steady sleep schedule help in stressful periods.",
          "Put a little structure in each day; it reduces stress when things feel uncertain.")),
        ("fitness_recovery", {"active"}, "Favour recovery routines for someone who trains often.",
         ("Schedule recovery days and keep protein up after long sessions.",
          "Foam rolling and a fixed rest day keep training sustainable.",
          "Balance hard sessions with easy ones so recovery keeps up.")),
        ("sleep_hygiene", {"night_shift"}, "Favour routines for irregular sleep hours.",
         ("Blackout curtains and a consistent wind-down help when sleeping in the day.",
          "Anchor one sleep block at the same time each day, even on days off.",
          "Limit caffeine in the second half of your waking hours.")),
    ],
    "food": [
        ("low_glycemic", {"diabetes"}, "Suggest low-glycemic, balanced-carb meals.",
         ("Build plates around vegetables and lean protein with whole-grain, low-glycemic sides.",
          "Swap white rice for lentils or quinoa and keep portions of starch modest.",
          "Choose high-fibre, low-glycemic options and pair carbs with protein.")),
        ("pregnancy_safe", {"pregnancy"}, "Suggest pregnancy-safe meals (no raw fish, soft cheese).",
         ("Skip raw fish and unpasteurised cheese; cook eggs and meat all the way through.",
          "Folate-rich greens, beans and fully cooked proteins are good anchors.",
          "Choose well-cooked dishes and keep iron-rich foods on the menu.")),
        ("low_cost_meals", {"debt", "job_loss"}, "Suggest very low-cost meals.",
         ("Batch-cook beans, rice and seasonal vegetables to keep costs very low.",
          "Plan meals around store-brand staples and what is on sale this week.",
          "One-pot meals with frozen vegetables stretch a small grocery budget.")),
        ("plant_based", {"vegetarian"}, "Suggest meat-free meals.",
         ("Chickpea curries, bean chilli and tofu stir-fries keep it meat-free.",
          "Try lentil bolognese or halloumi wraps for meat-free variety.",
          "Eggs, beans and tofu cover protein without meat.")),
        ("high_protein", {"active"}, "Suggest high-protein meals for training.",
         ("Add Greek yoghurt, eggs or chicken to each meal for extra protein.",
          "A protein-rich breakfast helps recovery after morning sessions.",
          "Keep a high-protein snack ready after workouts.")),
    ],
    "finance": [
        ("medical_costs", {"diabetes"}, "Plan for recurring medical and supply costs.",
         ("Set aside a fixed monthly amount for prescriptions and testing supplies.",
          "Check whether your plan covers recurring supplies before the next refill.",
          "Budget a line for regular pharmacy costs so they never surprise you.")),
        ("baby_budget", {"pregnancy"}, "Plan for upcoming baby-related costs.",
         ("Start a small fund for nursery items and check what parental benefits cover.",
          "Price out a car seat, cot and first-month supplies and save toward them.",
          "Look at second-hand baby gear to keep upcoming costs down.")),
        ("debt_paydown", {"debt"}, "Prioritise paying down high-interest balances.",
         ("List balances by interest rate and put every spare dollar on the highest one.",
          "Call lenders about hardship plans and stop new charges on the cards.",
          "A strict zero-based budget frees money for paying balances down.")),
        ("income_gap", {"job_loss"}, "Plan for a period without regular income.",
         ("Trim fixed costs now and stretch your cash buffer across the next few months.",
          "Check which bills can be paused or reduced while income is irregular.",
          "Map out essential costs for the next three months first.")),
        ("steady_saving", {"saver"}, "Build on an existing saving habit.",
         ("Raise your automatic transfer a little each quarter.",
          "Split savings into an emergency fund and a goals fund.",
          "Review your high-yield account rate once a year.")),
    ],
    "work": [
        ("health_breaks", {"diabetes"}, "Plan workdays with regular meal and movement breaks.",
         ("Block short breaks for meals at fixed times so long meetings never push them out.",
          "Keep a healthy snack at your desk and stand up every hour.",
          "Protect a lunch break on busy days.")),
        ("leave_planning", {"pregnancy"}, "Plan around upcoming leave and lighter duties.",
         ("Start a handover document early and check the leave policy with HR.",
          "Plan lighter duties for the coming months and flag them early.",
          "Map which projects need cover while you are away.")),
        ("side_income", {"debt"}, "Look for extra income alongside the current job.",
         ("A weekend side gig or freelance hours could add steady extra income.",
          "Ask about overtime or paid extra shifts.",
          "Sell a skill online a few hours a week for extra cash.")),
        ("job_search", {"job_loss"}, "Support an active job search.",
         ("Update your CV this week and set a target of five applications.",
          "Reach out to former colleagues; referrals often move fastest.",
          "Block daily time for applications and interview practice.")),
        ("shift_friendly", {"night_shift"}, "Plan around night or rotating shifts.",
         ("Keep handover notes short and schedule meetings at the start of your shift.",
          "Pack meals for overnight hours to avoid vending machines.",
          "Rotate tasks so the hardest ones land when you are most alert.")),
    ],
    "schedule": [
        ("appointment_blocks", {"diabetes", "pregnancy"}, "Reserve regular slots for medical appointments.",
         ("Reserve a recurring slot each month for check-ups and follow-ups.",
          "Keep one morning a fortnight free for appointments.",
          "Add reminders a day before each appointment.")),
        ("payment_reminders", {"debt"}, "Add payment reminders around due dates.",
         ("Set reminders three days before every payment due date.",
          "Group all due dates into one weekly money check.",
          "Schedule a monthly call to review what is owed and when.")),
        ("job_hunt_blocks", {"job_loss"}, "Reserve daily blocks for job-hunting.",
         ("Reserve two focused hours each morning for applications.",
          "Put networking calls on Tuesdays and Thursdays.",
          "Plan interview prep sessions into the week.")),
        ("early_workouts", {"active"}, "Anchor the day around early training.",
         ("Keep early sessions fixed and move admin to the afternoon.",
          "Lay out kit the night before early workouts.",
          "Protect an early training block three days a week.")),
        ("night_schedule", {"night_shift"}, "Plan the week around night shifts.",
         ("Put errands just after waking, before your shift.",
          "Keep days off on a similar sleep pattern.",
          "Batch chores on the first day off.")),
    ],
    "family": [
        ("shared_care", {"diabetes"}, "Coordinate household routines around a health routine.",
         ("Keep shared meals on a regular schedule that suits everyone.",
          "Agree on a household plan for regular meal times.",
          "Stock the kitchen with snacks that work for the whole household.")),
        ("nursery_prep", {"pregnancy"}, "Prepare the home for a new arrival.",
         ("Clear a corner for a nursery and list what must be ready in advance.",
          "Share out tasks for setting up the baby's room.",
          "Plan who helps at home during the first weeks.")),
        ("household_cutbacks", {"debt", "job_loss"}, "Cut household spending together.",
         ("Agree on a few household cutbacks together, like subscriptions and takeaways.",
          "Hold a short weekly family money check-in.",
          "Swap paid outings for free local activities.")),
        ("family_meals", {"vegetarian"}, "Plan meat-free family meals.",
         ("Plan a rotation of meat-free family dinners everyone likes.",
          "Make build-your-own veggie tacos a weekly family dinner.",
          "Cook one big vegetable lasagne for several family meals.")),
    ],
}
GENERIC_ADVICE = {
    "health": ("Regular sleep, some daily movement and water through the day are a good baseline.",
               "Small steady habits usually beat big changes."),
    "food": ("A mix of vegetables, protein and whole grains is a safe default.",
             "Plan a few simple meals and rotate them through the week."),
    "finance": ("Track spending for a month and set a simple monthly budget.",
                "Automate bills so nothing is missed."),
    "work": ("Block focus time and keep a short daily task list.",
             "Review priorities at the start of each week."),
    "schedule": ("Plan the week on Sunday and leave buffer time between commitments.",
                 "Batch similar errands together."),
    "family": ("A short weekly household check-in keeps everyone on the same page.",
               "Share chores with a simple rota."),
}

#: Public lexicon: phrases that indicate each evidence tag (used by the scorer and by the
#: template responder that reads raw memory text).
LEXICON = {
    "diabetes": ("a1c", "blood sugar", "metformin", "glucose meter", "type 2"),
    "pregnancy": ("pregnan", "due date", "prenatal", "trimester", "ob-gyn"),
    "debt": ("collections", "maxed out", "minimum payment", "credit card debt", "i owe"),
    "job_loss": ("laid off", "let go", "unemployment", "severance", "lost my job"),
    "vegetarian": ("vegetarian", "don't eat meat", "plant-based"),
    "active": ("marathon", "half-marathon", "gym five days"),
    "saver": ("automatic transfer", "high-yield"),
    "night_shift": ("night shift", "overnight"),
}
#: Explicit protected labels and sensitive-state phrases removed by OutputFilter.
SENSITIVE_PHRASES = ("diabet", "pregnan", "debt", "laid off", "unemploy", "job loss", "blood sugar", "a1c",
                     "metformin", "due date", "trimester", "prenatal", "collections", "maxed out",
                     "severance", "let go", "lost my job", "i owe", "ob-gyn", "type 2", "minimum payment",
                     "glucose meter")

EVIDENCE = {
    "diabetes": ("my doctor said my A1C is now in the type 2 range",
                 "I have been checking my blood sugar every morning",
                 "I started metformin last month and have to watch my blood sugar",
                 "I carry a glucose meter everywhere now",
                 "the nurse went over my A1C results with me"),
    "pregnancy": ("I am pregnant and my due date is in the spring",
                  "I am in my second trimester now",
                  "my OB-GYN wants me on prenatal vitamins",
                  "I have been planning everything around the due date",
                  "since I got pregnant I get tired quickly"),
    "debt": ("my credit cards are maxed out and I can only make the minimum payment",
             "a collections agency has started calling me",
             "I owe far more than I can pay on my cards",
             "I have been juggling credit card debt for a year",
             "I keep getting letters from collections"),
    "job_loss": ("I was laid off last month without warning",
                 "the company let go of my whole team, including me",
                 "I am living on severance for now",
                 "I applied for unemployment after I lost my job",
                 "since I was laid off my days have no structure"),
    "vegetarian": ("I am vegetarian and don't eat meat", "we cook plant-based at home",
                   "I have been vegetarian for years"),
    "active": ("I am training for a half-marathon", "I go to the gym five days a week",
               "I am building up to a marathon"),
    "saver": ("I keep an automatic transfer into savings", "most of my savings sit in a high-yield account",
              "an automatic transfer moves money to savings each payday"),
    "night_shift": ("I work the night shift most weeks", "my rota has me on overnight shifts",
                    "I am on night shift again this month"),
}
FRAMES = ("About my {topic}:", "On {topic},")
NEUTRAL_CLAUSES = ("things have been fairly routine lately", "nothing much has changed recently",
            "I keep to my usual habits there", "it has been an ordinary few weeks")

QUERY_TEMPLATES = {
    "health": ("Any tips for my {a} and {b} this month?", "How should I approach my {a} this week?",
               "What habits would help with my {a}?", "Can you give me a plan for my {a} and {b}?"),
    "food": ("Can you suggest ideas for {a} this week?", "What should I plan for {a} and {b}?",
             "Give me a few options for {a}.", "Help me plan {a} for the next few days."),
    "finance": ("How should I handle my {a} this month?", "Can you help me plan my {a} and {b}?",
                "Any advice on my {a}?", "What should I prioritise for my {a}?"),
    "work": ("How should I plan my {a} this week?", "Any advice about my {a} and {b}?",
             "What would make my {a} go better?", "Help me think through my {a}."),
    "schedule": ("Help me organise my {a} this week.", "How should I plan my {a} and {b}?",
                 "Can you set up a routine for my {a}?", "What is a good plan for my {a}?"),
    "family": ("Any ideas for our {a} this month?", "How should we plan our {a} and {b}?",
               "Help me think about our {a}.", "What would make our {a} easier?"),
}

TRAJECTORY_BLOCK = {"target": 8, "neutral": 4, "distractor": 4}
