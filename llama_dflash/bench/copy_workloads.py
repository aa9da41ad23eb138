"""Prompts whose answers copy from the prompt (the lookup drafter's home ground), and open ones.

Each workload maps to a list of prompts.  A prompt is a string (one user turn) or, for the
multi-turn chats, a tuple of turns alternating user / assistant and ending with a user turn;
`messages()` turns either into chat messages.  `COPY_HEAVY` is the tuning set (the lookup
drafter's defaults were chosen on it), `COPY_HEAVY_HELDOUT` a second set of the same categories
used only for the final check.  "open-chat" is the low-repetition control in both.
"""

from __future__ import annotations

from typing import Union

__all__ = ["Prompt", "COPY_WORKLOADS", "CONTROL_WORKLOAD", "COPY_HEAVY", "COPY_HEAVY_HELDOUT", "messages"]

#: A single user turn, or alternating user/assistant turns that end with a user turn.
Prompt = Union[str, tuple[str, ...]]

COPY_WORKLOADS = ("edit-function", "json-to-yaml", "csv-to-markdown", "repeat-paragraph",
                  "quote-document", "chat-repeat-list")
CONTROL_WORKLOAD = "open-chat"


def messages(prompt: Prompt) -> list[dict[str, str]]:
    """Chat messages of a prompt: a string is one user turn; a tuple alternates user/assistant."""
    turns = (prompt,) if isinstance(prompt, str) else tuple(prompt)
    if len(turns) % 2 == 0:
        raise ValueError("a multi-turn prompt must end with a user turn (odd number of turns)")
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]


_FN_STATS = '''def compute_stats(values):
    """Return count, mean, minimum and maximum of a list of numbers."""
    if not values:
        return None
    total = 0
    smallest = values[0]
    largest = values[0]
    for v in values:
        total += v
        if v < smallest:
            smallest = v
        if v > largest:
            largest = v
    count = len(values)
    mean = total / count
    return {
        "count": count,
        "mean": mean,
        "min": smallest,
        "max": largest,
        "total": total,
    }'''

_FN_CONFIG = '''def parse_config(path):
    """Read a key=value config file, skipping comments and blank lines."""
    cfg = {}
    with open(path) as handle:
        for line_no, line in enumerate(handle, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if "=" not in line:
                raise ValueError(f"line {line_no}: expected key=value")
            key, value = line.split("=", 1)
            key = key.strip()
            value = value.strip()
            if value.isdigit():
                value = int(value)
            elif value.lower() in ("true", "false"):
                value = value.lower() == "true"
            cfg[key] = value
    if "name" not in cfg:
        cfg["name"] = "default"
    return cfg'''

_FN_MERGE = '''def merge_intervals(intervals):
    """Merge overlapping [start, end] intervals and return them sorted."""
    if not intervals:
        return []
    ordered = sorted(intervals, key=lambda pair: pair[0])
    result = [list(ordered[0])]
    for start, end in ordered[1:]:
        last = result[-1]
        if start <= last[1]:
            last[1] = max(last[1], end)
        else:
            result.append([start, end])
    total_length = 0
    for start, end in result:
        total_length += end - start
    print("merged", len(intervals), "into", len(result))
    print("covered length", total_length)
    return result'''

_FN_WORDS = '''def count_words(text, stop_words=None):
    """Count how often each word occurs, ignoring case and stop words."""
    counts = {}
    if stop_words is None:
        stop_words = set()
    for raw in text.split():
        word = raw.strip(".,;:!?\\"'()").lower()
        if not word:
            continue
        if word in stop_words:
            continue
        if word in counts:
            counts[word] += 1
        else:
            counts[word] = 1
    ranked = sorted(counts.items(), key=lambda item: -item[1])
    top = ranked[:10]
    for word, n in top:
        print(word, n)
    return counts'''

_FN_BANK = '''class Account:
    def __init__(self, owner, balance=0):
        self.owner = owner
        self.balance = balance
        self.history = []

    def deposit(self, amount):
        if amount <= 0:
            raise ValueError("amount must be positive")
        self.balance += amount
        self.history.append(("deposit", amount))

    def withdraw(self, amount):
        if amount > self.balance:
            raise ValueError("insufficient funds")
        self.balance -= amount
        self.history.append(("withdraw", amount))

    def report(self):
        for kind, amount in self.history:
            print(kind, amount)
        print("balance", self.balance)'''

_FN_GRADES = '''def grade_students(scores):
    """Map each student's score to a letter grade and count the grades."""
    grades = {}
    tally = {"A": 0, "B": 0, "C": 0, "D": 0, "F": 0}
    for student, score in scores.items():
        if score >= 90:
            letter = "A"
        elif score >= 80:
            letter = "B"
        elif score >= 70:
            letter = "C"
        elif score >= 60:
            letter = "D"
        else:
            letter = "F"
        grades[student] = letter
        tally[letter] += 1
    best = max(scores, key=scores.get)
    print("best student:", best)
    return grades, tally'''

_JSON_SERVER = '''{
  "server": {
    "host": "0.0.0.0",
    "port": 8080,
    "workers": 4,
    "timeout_seconds": 30
  },
  "database": {
    "engine": "postgres",
    "host": "db.internal",
    "port": 5432,
    "name": "inventory",
    "pool_size": 10
  },
  "logging": {
    "level": "info",
    "file": "/var/log/app.log",
    "rotate": true
  },
  "features": ["search", "export", "audit"]
}'''

_JSON_RECIPE = '''{
  "recipe": "Tomato Soup",
  "servings": 4,
  "prep_minutes": 15,
  "cook_minutes": 30,
  "ingredients": [
    {"name": "tomatoes", "amount": "1 kg"},
    {"name": "onion", "amount": "1 large"},
    {"name": "garlic", "amount": "3 cloves"},
    {"name": "vegetable stock", "amount": "750 ml"},
    {"name": "olive oil", "amount": "2 tbsp"},
    {"name": "salt", "amount": "1 tsp"}
  ],
  "vegetarian": true,
  "tags": ["soup", "easy", "winter"]
}'''

_JSON_USER = '''{
  "id": 48213,
  "username": "mlopez",
  "email": "maria.lopez@example.com",
  "active": true,
  "roles": ["editor", "reviewer"],
  "profile": {
    "first_name": "Maria",
    "last_name": "Lopez",
    "city": "Valencia",
    "country": "Spain",
    "language": "es"
  },
  "preferences": {
    "theme": "dark",
    "notifications": false,
    "items_per_page": 25
  }
}'''

_JSON_PIPELINE = '''{
  "pipeline": "nightly-build",
  "trigger": {"branch": "main", "schedule": "0 2 * * *"},
  "stages": [
    {"name": "checkout", "timeout": 5},
    {"name": "install", "timeout": 15},
    {"name": "test", "timeout": 40},
    {"name": "package", "timeout": 10},
    {"name": "publish", "timeout": 5}
  ],
  "notify": {
    "email": "builds@example.com",
    "on_failure": true,
    "on_success": false
  },
  "artifacts": ["dist/app.tar.gz", "reports/coverage.xml"]
}'''

_JSON_BOOKS = '''{
  "library": "Riverside Branch",
  "opening_hours": {"weekdays": "9-18", "saturday": "10-14", "sunday": "closed"},
  "books": [
    {"title": "The Hobbit", "author": "J. R. R. Tolkien", "year": 1937, "available": true},
    {"title": "Dune", "author": "Frank Herbert", "year": 1965, "available": false},
    {"title": "Emma", "author": "Jane Austen", "year": 1815, "available": true},
    {"title": "Beloved", "author": "Toni Morrison", "year": 1987, "available": true}
  ],
  "members": 1240,
  "wifi": true
}'''

_JSON_SENSOR = '''{
  "device_id": "greenhouse-07",
  "firmware": "2.4.1",
  "location": {"building": "B", "row": 3, "latitude": 52.37, "longitude": 4.89},
  "sensors": [
    {"type": "temperature", "unit": "celsius", "value": 24.5},
    {"type": "humidity", "unit": "percent", "value": 61},
    {"type": "light", "unit": "lux", "value": 18000},
    {"type": "soil_moisture", "unit": "percent", "value": 38}
  ],
  "battery_percent": 87,
  "online": true
}'''

_CSV_CITIES = '''city,country,population_millions,area_km2
Tokyo,Japan,37.4,2194
Delhi,India,31.0,1484
Shanghai,China,27.1,6341
Sao Paulo,Brazil,22.0,1521
Mexico City,Mexico,21.8,1485
Cairo,Egypt,21.3,3085
Mumbai,India,20.7,603'''

_CSV_SALES = '''month,region,units,revenue_usd
January,North,120,14400
January,South,95,11400
February,North,130,15600
February,South,88,10560
March,North,142,17040
March,South,101,12120'''

_CSV_STAFF = '''name,department,role,start_year,office
Alice Martin,Engineering,Backend Developer,2018,Berlin
Ben Okafor,Engineering,QA Engineer,2020,Lagos
Chen Wei,Design,Product Designer,2019,Shanghai
Diana Rossi,Sales,Account Manager,2016,Milan
Erik Larsen,Support,Team Lead,2015,Oslo
Fatima Zahra,Finance,Controller,2021,Casablanca'''

_CSV_PLANETS = '''planet,diameter_km,moons,day_length_hours
Mercury,4879,0,4222.6
Venus,12104,0,2802.0
Earth,12756,1,24.0
Mars,6792,2,24.7
Jupiter,142984,95,9.9
Saturn,120536,146,10.7
Uranus,51118,28,17.2'''

_CSV_COURSES = '''code,title,credits,teacher,weekday
CS101,Introduction to Programming,6,Dr. Novak,Monday
MA201,Linear Algebra,5,Prof. Ibrahim,Tuesday
PH110,Mechanics,5,Dr. Santos,Wednesday
CS230,Databases,6,Dr. Novak,Thursday
EN105,Academic Writing,3,Ms. Keller,Friday'''

_CSV_TRAINS = '''train,from,to,departs,arrives,platform
IC 512,Amsterdam,Utrecht,08:04,08:31,5b
IC 518,Utrecht,Eindhoven,08:45,09:33,7
SPR 4021,Leiden,The Hague,09:10,09:24,2
IC 730,Rotterdam,Breda,09:15,09:39,12
ICE 105,Amsterdam,Cologne,10:00,12:40,14a
IC 845,Zwolle,Groningen,10:22,11:29,3'''

_DOC_LEASE = '''1. The tenant shall pay the rent of 950 euros on the first day of each month.
2. The deposit is two months of rent and is returned within 30 days after the lease ends.
3. Pets are allowed only with the written permission of the landlord.
4. The tenant must not sublet the apartment without written consent.
5. Smoking is not permitted inside the apartment or on the balcony.
6. The landlord is responsible for repairs to heating, plumbing and electrical systems.
7. The tenant is responsible for minor repairs costing less than 50 euros.
8. Either party may end the lease with three months of written notice.
9. Quiet hours are from 10 pm to 7 am every day.
10. The rent may be increased once per year by at most 3 percent.'''

_DOC_POLICY = '''1. Employees may work from home up to three days per week.
2. Core hours are from 10 am to 3 pm, when everyone must be reachable.
3. Travel expenses must be submitted within 30 days with the original receipts.
4. Meals during business travel are reimbursed up to 40 euros per day.
5. Annual leave is 25 days per year, and up to 5 unused days may be carried over.
6. Sick leave of more than two days requires a doctor's note.
7. Laptops must be locked with a password whenever they are left unattended.
8. Customer data may never be stored on personal devices.
9. New employees receive a mentor for their first three months.
10. Training courses are paid by the company up to 1500 euros per year.'''

_DOC_POOL = '''1. The pool is open from 7 am to 9 pm on weekdays and from 9 am to 6 pm on weekends.
2. All swimmers must shower before entering the pool.
3. Children under 12 must be accompanied by an adult at all times.
4. Running on the pool deck is not allowed.
5. Glass bottles and food are not permitted in the pool area.
6. The deep end is reserved for swimmers who can swim 50 meters without stopping.
7. Lane swimming takes place every weekday from 7 am to 9 am.
8. Swimming caps are required for swimmers with long hair.
9. Lockers must be emptied by closing time or their contents will be removed.
10. Lifeguards have the final say on all safety matters.'''

_DOC_WARRANTY = '''1. The product is covered by a warranty of two years from the date of purchase.
2. The warranty covers defects in materials and workmanship.
3. Damage caused by water, drops or misuse is not covered.
4. Batteries are covered for one year or 500 charging cycles, whichever comes first.
5. A proof of purchase is required for every warranty claim.
6. Repairs are made within 14 working days after the product is received.
7. If a repair is not possible, the product is replaced with an equivalent model.
8. Opening the device yourself voids the warranty.
9. Shipping costs for warranty repairs are paid by the manufacturer.
10. The warranty is valid only in the country where the product was bought.'''

_DOC_LIBRARY = '''1. Members may borrow up to eight items at a time.
2. Books are lent for three weeks and may be renewed twice.
3. DVDs are lent for one week and cannot be renewed.
4. The late fee is 20 cents per item per day, up to 5 euros per item.
5. Lost items are charged at their replacement cost plus a 3 euro handling fee.
6. Children's cards are free, and adult cards cost 25 euros per year.
7. The reading room is silent; phone calls must be taken outside.
8. Group study rooms can be booked for at most two hours per day.
9. Printing costs 10 cents per black-and-white page and 30 cents per color page.
10. Members must report a change of address within one month.'''

_DOC_CAMP = '''1. Campers must check in at the office between 2 pm and 8 pm on the day of arrival.
2. Check-out is before 11 am on the day of departure.
3. Each pitch may hold one tent, one car and at most six people.
4. Campfires are allowed only in the fire pits near the lake.
5. Quiet time starts at 11 pm and lasts until 7 am.
6. Dogs must be kept on a leash and are not allowed on the beach.
7. Drinking water is available at the taps next to the shower block.
8. Waste must be sorted into the bins for glass, plastic and general waste.
9. Visitors must leave the campsite by 10 pm.
10. The shop sells bread every morning from 8 am to 10 am.'''

_PACKING_LIST = """Here is a packing list for a weekend hiking trip:

1. Backpack (30-40 liters)
2. Hiking boots, broken in
3. Rain jacket and warm fleece
4. Two pairs of wool socks
5. Water bottles (2 liters in total)
6. Trail snacks: nuts, dried fruit and energy bars
7. Map, compass and a charged phone
8. First aid kit with plasters and painkillers
9. Sunscreen, sunglasses and a hat
10. Headlamp with spare batteries"""

_SHOPPING_LIST = """Here is a shopping list for a lasagna for six people:

- 12 lasagna sheets
- 500 g minced beef
- 1 onion
- 2 cloves of garlic
- 800 g canned chopped tomatoes
- 2 tablespoons of tomato paste
- 50 g butter
- 50 g flour
- 600 ml milk
- 150 g grated parmesan
- Salt, pepper and nutmeg"""

_STEPS_LIST = """These are the steps to set up the new laptop:

1. Unpack the laptop and connect the charger.
2. Turn it on and choose your language and region.
3. Connect to the office Wi-Fi network.
4. Sign in with your company account.
5. Install the latest system updates and restart.
6. Install the password manager and the VPN client.
7. Turn on disk encryption in the security settings.
8. Set up the printer from the network printers list.
9. Copy your files from the old laptop with the migration tool.
10. Ask IT to check the setup before you start working."""

_MORNING_LIST = """Here is a simple morning routine:

1. Wake up at the same time every day.
2. Drink a glass of water.
3. Open the curtains and let in daylight.
4. Stretch for five minutes.
5. Take a short walk outside.
6. Eat a breakfast with protein and fruit.
7. Write down the three most important tasks of the day.
8. Check your messages only after these steps."""

_BIRD_LIST = """Common garden birds you may see in spring:

1. Robin - red breast, often sings from a fence post.
2. Blackbird - the male is black with a yellow beak.
3. Blue tit - small, with a blue cap and yellow belly.
4. Great tit - black head, white cheeks and a black stripe on a yellow chest.
5. House sparrow - brown and grey, often in noisy groups.
6. Chaffinch - the male has a pink breast and a blue-grey head.
7. Wren - tiny and brown, with a loud song and an upright tail.
8. Starling - dark with a green and purple shine, often in flocks."""

_TRAVEL_LIST = """Documents to bring for your trip to Canada:

- Valid passport
- Electronic travel authorization (eTA) confirmation
- Return flight ticket
- Hotel booking confirmation
- Travel insurance certificate
- Credit card and some Canadian dollars
- Driving licence and international driving permit
- Emergency contact list"""

COPY_HEAVY: dict[str, list[Prompt]] = {
    "edit-function": [
        "Rename the variable `total` to `running_sum` everywhere in this Python function. "
        "Reply with the complete updated function only.\n\n" + _FN_STATS,
        "Rename the variable `cfg` to `settings` everywhere in this Python function. "
        "Reply with the complete updated function only.\n\n" + _FN_CONFIG,
        "Rename the variable `result` to `merged` everywhere in this Python function. "
        "Reply with the complete updated function only.\n\n" + _FN_MERGE,
    ],
    "json-to-yaml": [
        "Convert this JSON object to YAML. Reply with the YAML only.\n\n" + _JSON_SERVER,
        "Convert this JSON object to YAML. Reply with the YAML only.\n\n" + _JSON_RECIPE,
        "Convert this JSON object to YAML. Reply with the YAML only.\n\n" + _JSON_USER,
    ],
    "csv-to-markdown": [
        "Reformat this CSV table as a Markdown table.\n\n" + _CSV_CITIES,
        "Reformat this CSV table as a Markdown table.\n\n" + _CSV_SALES,
        "Reformat this CSV table as a Markdown table.\n\n" + _CSV_STAFF,
    ],
    "repeat-paragraph": [
        "Repeat the following paragraph exactly, but change the word 'morning' to 'evening' and "
        "the word 'quiet' to 'busy'.\n\nEvery morning the old harbor was quiet. The fishing boats "
        "had already left before sunrise, and only the gulls walked along the wooden pier. An old "
        "man sat on a bench near the lighthouse, reading yesterday's newspaper and drinking coffee "
        "from a metal cup. Now and then a cat came by to see if he had brought any fish, and he "
        "always had a small piece for her.",
        "Repeat the following paragraph exactly, but change the word 'red' to 'green' and the word "
        "'Tuesday' to 'Friday'.\n\nOn Tuesday the school painted its front door red. The children "
        "had voted for the color in a long and serious meeting, and the headmaster had promised to "
        "respect the result. Two parents brought ladders and brushes, and by the afternoon the door "
        "was shining in the sun. Everyone who walked past stopped to look at it, and some people "
        "even took photographs.",
        "Repeat the following paragraph exactly, but change the word 'train' to 'bus' and the word "
        "'cold' to 'warm'.\n\nThe train to the mountains left at seven. It was a cold day, and the "
        "passengers held their coffee with both hands while the valley slowly turned white outside "
        "the windows. A group of students played cards at the back of the carriage, and a woman "
        "with a large dog tried to read a book. When the train finally stopped, everyone hurried "
        "out into the snow.",
    ],
    "quote-document": [
        "Here is a lease agreement:\n\n" + _DOC_LEASE + "\n\nUsing exact quotes from the agreement, "
        "answer: what are the rules about money (rent, deposit and repairs)?",
        "Here is a company policy:\n\n" + _DOC_POLICY + "\n\nUsing exact quotes from the policy, "
        "answer: what are the rules about working from home, leave and expenses?",
        "Here are the rules of a swimming pool:\n\n" + _DOC_POOL + "\n\nUsing exact quotes from "
        "the rules, answer: what rules apply to children and to safety?",
    ],
    "chat-repeat-list": [
        ("I am going hiking this weekend. What should I pack?", _PACKING_LIST,
         "Thanks! How long should a beginner hike be?",
         "For a beginner, a hike of 8 to 12 kilometers with about 300 meters of climbing is a good "
         "start. Plan about four hours including breaks, and choose a well-marked trail.",
         "Please repeat the packing list from your first answer, exactly as before, so I can print it."),
        ("I want to cook lasagna for six friends. What do I need to buy?", _SHOPPING_LIST,
         "How long does it take to make?",
         "Plan about 30 minutes for the meat sauce, 10 minutes for the white sauce, 10 minutes to "
         "assemble the layers and 45 minutes in the oven at 180 degrees.",
         "Can you give me the shopping list again, exactly as before?"),
        ("I got a new work laptop. How do I set it up?", _STEPS_LIST,
         "What if the Wi-Fi does not work?",
         "Check that Wi-Fi is switched on, forget the network and connect again with your company "
         "password. If it still fails, plug in a network cable and contact IT.",
         "It works now. Please list the setup steps again, exactly as before."),
    ],
    CONTROL_WORKLOAD: [
        "Explain how photosynthesis works.",
        "Write the opening of a short story about a girl who finds a map in her grandmother's attic.",
        "What advice would you give to someone who wants to learn a new language as an adult?",
        "Why do leaves change color in autumn?",
        "What makes a good friend? Share your thoughts.",
        "Describe a perfect lazy Sunday.",
    ],
}

COPY_HEAVY_HELDOUT: dict[str, list[Prompt]] = {
    "edit-function": [
        "Rename the variable `counts` to `frequencies` everywhere in this Python function. "
        "Reply with the complete updated function only.\n\n" + _FN_WORDS,
        "Rename the attribute `history` to `transactions` everywhere in this Python class. "
        "Reply with the complete updated class only.\n\n" + _FN_BANK,
        "Rename the variable `tally` to `grade_counts` everywhere in this Python function. "
        "Reply with the complete updated function only.\n\n" + _FN_GRADES,
    ],
    "json-to-yaml": [
        "Convert this JSON object to YAML. Reply with the YAML only.\n\n" + _JSON_PIPELINE,
        "Convert this JSON object to YAML. Reply with the YAML only.\n\n" + _JSON_BOOKS,
        "Convert this JSON object to YAML. Reply with the YAML only.\n\n" + _JSON_SENSOR,
    ],
    "csv-to-markdown": [
        "Reformat this CSV table as a Markdown table.\n\n" + _CSV_PLANETS,
        "Reformat this CSV table as a Markdown table.\n\n" + _CSV_COURSES,
        "Reformat this CSV table as a Markdown table.\n\n" + _CSV_TRAINS,
    ],
    "repeat-paragraph": [
        "Repeat the following paragraph exactly, but change the word 'garden' to 'park' and the "
        "word 'small' to 'large'.\n\nBehind the house there was a small garden with an apple tree "
        "and a wooden bench. In summer my grandfather spent every afternoon there, reading, "
        "sleeping or talking to the neighbors over the fence. The garden was never very tidy, but "
        "it was full of birds, and in September the whole family came to pick the apples.",
        "Repeat the following paragraph exactly, but change the word 'rain' to 'snow' and the word "
        "'Monday' to 'Sunday'.\n\nIt started to rain on Monday and did not stop for three days. "
        "The river rose slowly, the streets near the bridge were closed, and the children were "
        "sent home early from school. People put sandbags in front of their doors and watched the "
        "water from their windows. When the sun finally came out, the whole town went outside to "
        "look at the river.",
        "Repeat the following paragraph exactly, but change the word 'library' to 'museum' and the "
        "word 'old' to 'new'.\n\nThe old library stood in the middle of the square. Its doors "
        "opened at nine, and every morning the same three people were waiting outside: a student "
        "with a heavy bag, a retired teacher, and a man who only read newspapers. The librarian "
        "knew them all by name and always kept the best chair by the window for the teacher.",
    ],
    "quote-document": [
        "Here is a product warranty:\n\n" + _DOC_WARRANTY + "\n\nUsing exact quotes from the "
        "warranty, answer: what is not covered, and what do I need for a claim?",
        "Here are the rules of a library:\n\n" + _DOC_LIBRARY + "\n\nUsing exact quotes from the "
        "rules, answer: how long can I borrow things and what does it cost if I am late?",
        "Here are the rules of a campsite:\n\n" + _DOC_CAMP + "\n\nUsing exact quotes from the "
        "rules, answer: what are the rules about times (arrival, departure, quiet time)?",
    ],
    "chat-repeat-list": [
        ("I want a better morning routine. Any suggestions?", _MORNING_LIST,
         "Is it okay to drink coffee first thing?",
         "Many people do, but waiting 30 to 60 minutes after waking and drinking water first can "
         "help you feel more awake and avoid an energy dip later in the morning.",
         "Please repeat the morning routine list from before, exactly as it was."),
        ("Which birds might I see in my garden in spring?", _BIRD_LIST,
         "What should I put in a bird feeder?",
         "Sunflower seeds, peanuts in a mesh feeder and fat balls attract most garden birds. Keep "
         "the feeder clean and put out fresh water as well.",
         "Can you show me the list of birds again, exactly as before?"),
        ("I am traveling to Canada next month. What documents should I bring?", _TRAVEL_LIST,
         "How early should I be at the airport?",
         "For an international flight, arrive about three hours before departure so you have time "
         "for check-in, security and passport control.",
         "Please repeat the list of documents from your first answer, exactly as before."),
    ],
    CONTROL_WORKLOAD: [
        "How do vaccines help the body fight disease?",
        "Write the opening of a short story about a boy who hears music coming from an empty house.",
        "What advice would you give to someone starting their first job?",
        "Why is the sky blue?",
        "What are the benefits of reading books? Share your thoughts.",
        "Describe a walk along the beach at sunset.",
    ],
}
